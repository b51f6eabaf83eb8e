"""`latte deploy k8s` (manifests and an image recipe serving a repository on Kubernetes), `latte deploy validate`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

K8S_DESCRIPTION = """\
Render what a Kubernetes cluster needs to serve REPO with Triton and latte's backend:

  OUT/deployment.yaml  pods running `latte serve`, which supervises tritonserver's models: probes
                       on its health port's /live and /ready, Prometheus scrape annotations,
                       GPU requests when a model uses KIND_GPU
  OUT/service.yaml     HTTP 8000, gRPC 8001, metrics 8002, health 8003
  OUT/hpa.yaml         autoscaling/v2 on Triton's queue time (or pending requests)
  OUT/pdb.yaml         at most one replica down during node drains
  OUT/prometheus-adapter/values.yaml   the custom-metrics rule the autoscaler reads
  OUT/image/Dockerfile the image: latte installed on nvcr.io/nvidia/tritonserver
  OUT/README.md        the commands to build, upload, apply, in order

With --kserve, OUT/inferenceservice.yaml (KServe's Triton runtime) replaces the
first four. With --canary-percent P, OUT/canary.yaml alone: a Deployment NAME-canary
of the new image/models that the running NAME's Service also reaches, sized so that
it holds about P % of the pods (with --kserve: canaryTrafficPercent P instead). Every manifest is validated against the Kubernetes (and KServe) schemas
before the command returns.
"""

K8S_EPILOG = """\
examples:
  latte examples repo
  latte deploy k8s repo -o k8s --image registry.example.com/ml/latte-triton:0.1.0
  latte deploy k8s repo -o k8s --image REG/latte-triton:0.1.0 --model-uri s3://models/latte \\
      --storage-secret s3-credentials --target-rps 2000 --replica-throughput 450 --headroom 0.2
  latte deploy k8s repo -o kserve --kserve --image REG/latte-triton:0.1.0 --model-uri gs://models/latte
  latte deploy k8s repo -o canary --canary-percent 10 --image REG/latte-triton:0.2.0 \
      --model-uri pvc://latte-models/v2

sizing: replicas = ceil(target_rps x (1 + headroom) / replica_throughput), where the
throughput is one replica's, measured at the concurrency where its p99 meets your
budget (perf_analyzer, `latte demo`). See docs/scale-out.md.
"""


def _whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    deploy = sub.add_parser("deploy", help="deploy a model repository beyond one machine (Kubernetes, KServe)",
                            description="Deploy a latte model repository beyond one machine.")
    targets = deploy.add_subparsers(dest="target", metavar="TARGET")

    def _usage(_args) -> int:
        deploy.print_help()
        return 2

    deploy.set_defaults(handler=_usage)

    from latte.deploy.options import DEFAULT_TRITON_IMAGE, SCALE_METRICS

    p = targets.add_parser("k8s", help="render validated Kubernetes manifests and the image's Dockerfile",
                           description=K8S_DESCRIPTION, epilog=K8S_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("repo", help="the model repository (from `latte examples` or `latte generate`)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="folder the files are written to")

    g = p.add_argument_group("image")
    g.add_argument("--image", metavar="REF",
                   help="the Latte-on-Triton image the pods run, built from OUT/image/Dockerfile and pushed "
                        "(required), e.g. registry.example.com/ml/latte-triton:0.1.0")
    g.add_argument("--triton-image", default=DEFAULT_TRITON_IMAGE, metavar="REF",
                   help="the tritonserver image the Dockerfile builds on (default: %(default)s, Triton 2.51)")

    g = p.add_argument_group("where the models are")
    g.add_argument("--model-uri", metavar="URI",
                   help="s3://BUCKET/PATH, gs://BUCKET/PATH or as://ACCOUNT/CONTAINER/PATH (Triton reads it "
                        "directly) or pvc://CLAIM[/PATH] (a volume mounted read-only); default pvc://NAME-models")
    g.add_argument("--storage-secret", metavar="SECRET",
                   help="Secret with the bucket's credentials (AWS_* / AZURE_STORAGE_* variables, or key.json "
                        "for gs://)")
    g.add_argument("--service-account", metavar="NAME", help="pods' ServiceAccount (e.g. for workload identity)")

    g = p.add_argument_group("resources per pod")
    g.add_argument("--gpus", type=_whole_number, metavar="N",
                   help="GPUs per pod (default: what the models' KIND_GPU instance groups need, 0 without any)")
    g.add_argument("--gpu-resource", default="nvidia.com/gpu", metavar="NAME",
                   help="extended resource name of a GPU (default: %(default)s)")
    g.add_argument("--cpu", metavar="QTY", help="CPU request (default: the latte models' instances x intra-op threads)")
    g.add_argument("--memory", default="4Gi", metavar="QTY", help="memory request and limit (default: %(default)s)")
    g.add_argument("--shm-size", default="1Gi", metavar="QTY",
                   help="size of /dev/shm, through which the Python backend moves tensors (default: %(default)s)")

    g = p.add_argument_group("scaling")
    g.add_argument("--min-replicas", type=int, metavar="N", help="fewest replicas (default 2, or from --target-rps)")
    g.add_argument("--max-replicas", type=int, metavar="N", help="most replicas (default: twice the minimum)")
    g.add_argument("--scale-metric", choices=SCALE_METRICS, default="queue-time",
                   help="queue-time: average microseconds a request waits in Triton's queue; pending: requests "
                        "waiting (default: %(default)s)")
    g.add_argument("--target-queue-us", type=int, default=10000, metavar="US",
                   help="queue time per request to hold each pod at (default: %(default)s)")
    g.add_argument("--target-pending", type=int, default=16, metavar="N",
                   help="pending requests per pod to hold (default: %(default)s; with --kserve, requests in flight)")
    g.add_argument("--target-rps", type=_positive_number, metavar="RPS",
                   help="request rate the fleet must carry; sets --min-replicas from the replica throughput")
    g.add_argument("--replica-throughput", type=_positive_number, metavar="RPS",
                   help="one replica's throughput at its operating point (req/s)")
    g.add_argument("--profile", metavar="JSON",
                   help="a file holding one replica's {\"throughput_rps\": ..., \"p99_ms\": ...} instead of "
                        "--replica-throughput")
    g.add_argument("--p99-budget-ms", type=_positive_number, metavar="MS",
                   help="refuse a profile whose p99 is over this budget")
    g.add_argument("--headroom", type=float, default=0.0, metavar="FRACTION",
                   help="spare capacity on top of --target-rps, e.g. 0.2 (default: %(default)s)")

    g = p.add_argument_group("output")
    g.add_argument("--name", default="latte", help="name of every resource (default: %(default)s)")
    g.add_argument("--namespace", help="namespace written into the manifests (default: none, kubectl's current)")
    g.add_argument("--kserve", action="store_true",
                   help="render a KServe InferenceService on the kserve-tritonserver runtime instead")
    g.add_argument("--kubernetes-version", default="1.33.0", metavar="X.Y.Z",
                   help="Kubernetes release whose schemas validate the manifests (default: %(default)s)")

    g = p.add_argument_group("security (secure by default; each flag relaxes one setting, docs/scale-out.md)")
    g.add_argument("--run-as-user", type=int, default=1000, metavar="UID",
                   help="the non-root user the pods run as (default: %(default)s, the NGC image's triton-server)")
    g.add_argument("--writable-root-filesystem", action="store_true",
                   help="let the container write outside /tmp and /dev/shm (a model that writes next to itself)")
    g.add_argument("--admin-secret", metavar="NAME",
                   help="the Secret (key `token`) whose value Triton's admin APIs ask for in the header "
                        "latte-admin-key (default: NAME-admin)")
    g.add_argument("--open-admin-apis", action="store_true",
                   help="leave shared memory, model repository, logging and trace open to anyone who reaches a pod")
    g.add_argument("--no-network-policy", action="store_true", help="render no NetworkPolicy")
    g.add_argument("--client-label", default="latte.dev/client=true", metavar="KEY=VALUE",
                   help="the label of the pods (any namespace) the NetworkPolicy lets call HTTP and gRPC "
                        "(default: %(default)s)")
    g.add_argument("--monitoring-namespace", default="monitoring", metavar="NAME",
                   help="the namespace the NetworkPolicy lets scrape the metrics and health ports "
                        "(default: %(default)s)")

    g = p.add_argument_group("monitoring (OUT/monitoring/, OUT/grafana/; docs/scale-out.md, \"Watching it\")")
    g.add_argument("--pod-monitor", action="store_true",
                   help="render a PodMonitor instead of a ServiceMonitor (the Prometheus Operator's objects)")
    g.add_argument("--no-scrape-monitor", action="store_true", help="render neither a ServiceMonitor nor a PodMonitor")
    g.add_argument("--monitor-label", metavar="KEY=VALUE",
                   help="a label for the monitor, the rules and the dashboard, where the Prometheus Operator "
                        "selects them by one (kube-prometheus-stack: release=<its release name>)")
    g.add_argument("--no-alerts", action="store_true", help="render no PrometheusRule")
    g.add_argument("--no-dashboard", action="store_true", help="render no Grafana dashboard")
    g.add_argument("--slo-ms", type=_positive_number, default=100.0, metavar="MS",
                   help="P95 bound of a latte model whose config sets no slo_ms parameter (default: %(default)s)")
    g.add_argument("--forecast-horizon-h", type=_positive_number, default=6.0, metavar="H",
                   help="how far ahead the P95 trend alert projects (default: %(default)s)")
    g.add_argument("--alert-error-ratio", type=_positive_number, default=0.01, metavar="FRACTION",
                   help="share of failed requests over 5 minutes that alerts (default: %(default)s)")
    g.add_argument("--alert-rss-growth-mib-per-h", type=_positive_number, default=256.0, metavar="MIB",
                   help="resident memory growth per hour of an instance that alerts (default: %(default)s)")

    g = p.add_argument_group("rollout and cache")
    g.add_argument("--canary-percent", type=_whole_number, metavar="P",
                   help="render this repository/image as a canary getting P %% of the traffic of the running "
                        "deployment of the same --name: KServe's canaryTrafficPercent with --kserve, otherwise "
                        "a Deployment NAME-canary sized to P %% of the pods (docs/scale-out.md)")
    g.add_argument("--response-cache-size", metavar="SIZE",
                   help="bytes of Triton's response cache per pod, e.g. 256Mi; 0 for none (default: 256Mi when "
                        "a model's config has response_cache { enable: true }, none otherwise)")
    p.set_defaults(handler=_k8s)

    p = targets.add_parser("validate", help="check manifests (e.g. after editing them) against the API schemas",
                           description="Validate Kubernetes manifests offline: core kinds against the strict "
                                       "schemas of --kubernetes-version, KServe InferenceServices against "
                                       "latte's v1beta1 schema. A folder means its *.yaml files.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="manifest files or folders")
    p.add_argument("--kubernetes-version", default="1.33.0", metavar="X.Y.Z",
                   help="Kubernetes release whose schemas apply (default: %(default)s)")
    p.set_defaults(handler=_validate)


def _min_replicas(args) -> int:
    from latte.deploy import DeployError, replicas_for_rate

    sizing = args.replica_throughput is not None or args.profile is not None
    if args.target_rps is None:
        if sizing:
            raise DeployError("--replica-throughput/--profile size the fleet only together with --target-rps")
        return 2 if args.min_replicas is None else args.min_replicas
    if args.min_replicas is not None:
        raise DeployError("give either --min-replicas or --target-rps (which computes it), not both")
    if args.profile:
        try:
            profile = json.loads(Path(args.profile).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DeployError(f"--profile {args.profile}: cannot read a JSON profile: {exc}") from None
    elif args.replica_throughput is not None:
        profile = {"throughput_rps": args.replica_throughput}
    else:
        raise DeployError("--target-rps needs one replica's throughput: --replica-throughput RPS or --profile FILE")
    return replicas_for_rate(args.target_rps, profile, args.headroom, args.p99_budget_ms)


def _k8s(args) -> int:
    from latte.deploy import K8sOptions, render_k8s
    from latte.triton.cache import parse_size

    min_replicas = _min_replicas(args)
    options = K8sOptions(
        image=args.image, triton_image=args.triton_image, name=args.name, namespace=args.namespace,
        model_uri=args.model_uri, storage_secret=args.storage_secret, service_account=args.service_account,
        gpus=args.gpus, gpu_resource=args.gpu_resource, cpu=args.cpu, memory=args.memory, shm_size=args.shm_size,
        min_replicas=min_replicas, max_replicas=args.max_replicas, scale_metric=args.scale_metric,
        target_queue_us=args.target_queue_us, target_pending=args.target_pending, kserve=args.kserve,
        kubernetes_version=args.kubernetes_version, canary_percent=args.canary_percent,
        response_cache_bytes=parse_size(args.response_cache_size) if args.response_cache_size is not None else None,
        run_as_user=args.run_as_user, writable_root=args.writable_root_filesystem, admin_secret=args.admin_secret,
        open_admin_apis=args.open_admin_apis, network_policy=not args.no_network_policy,
        client_label=args.client_label, monitoring_namespace=args.monitoring_namespace,
        scrape_monitor=not args.no_scrape_monitor, pod_monitor=args.pod_monitor, monitor_label=args.monitor_label,
        alerts=not args.no_alerts,
        dashboard=not args.no_dashboard, slo_ms=args.slo_ms, forecast_horizon_h=args.forecast_horizon_h,
        error_ratio=args.alert_error_ratio, rss_growth_mib_per_h=args.alert_rss_growth_mib_per_h,
    )
    result = render_k8s(Path(args.repo), Path(args.out), options)
    opts = result.options
    print(f"{len(result.repository.models)} model(s) from {result.repository.path}")
    print(f"  per pod: {result.cpu} CPU, {opts.memory} memory, {result.gpus} GPU(s); "
          f"replicas {opts.min_replicas}..{opts.max_replicas}")
    if result.canary_replicas:
        print(f"  canary: {result.canary_replicas} pod(s) beside at least {opts.min_replicas} stable, "
              f"{result.canary_share} % of the pods (asked {opts.canary_percent} %)")
    for path in result.files:
        print(f"  wrote {path}")
    print(f"validated {len(result.manifests)} manifest(s) against "
          f"{'KServe v1beta1' if opts.kserve else 'Kubernetes ' + opts.kubernetes_version}")
    print(f"next: follow {result.out_dir / 'README.md'}")
    return 0


def _validate(args) -> int:
    from latte.deploy import DeployError
    from latte.deploy.validation import validate_files

    files = []
    for name in args.paths:
        path = Path(name)
        if path.is_dir():
            files.extend(sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")))
        elif path.is_file():
            files.append(path)
        else:
            raise DeployError(f"{path} does not exist")
    if not files:
        raise DeployError(f"no *.yaml manifests in {', '.join(args.paths)}")
    count = validate_files(files, args.kubernetes_version)
    print(f"{count} object(s) in {len(files)} file(s) are valid")
    return 0
