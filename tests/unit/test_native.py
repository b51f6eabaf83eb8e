from latte import _native, __version__


def test_native_core_reports_its_build():
    info = _native.build_info()
    assert info["version"] == __version__
    assert isinstance(info["cuda"], bool)
    assert info["compiler"].split()[0] in ("gcc", "clang")
