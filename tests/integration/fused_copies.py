"""Serving a repository's ensemble and its `latte fuse` model side by side."""

import re
import shutil


def fused_beside_ensemble(work, repo, ensemble: str):
    """A copy of `repo` in work/served with `latte fuse`'s model of `ensemble` beside the
    ensemble, as <ensemble>_fused: one server serves both."""
    from latte.generator.fuse import fuse_repository

    fuse_repository(repo, ensemble, work / "fused")
    served = work / "served"
    shutil.copytree(repo, served)
    shutil.copytree(work / "fused" / ensemble, served / f"{ensemble}_fused")
    config = served / f"{ensemble}_fused" / "config.pbtxt"
    config.write_text(re.sub(r'^name: ".*"$', f'name: "{ensemble}_fused"', config.read_text(), count=1, flags=re.M))
    return served
