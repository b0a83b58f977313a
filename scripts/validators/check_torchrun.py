"""torchrun harness (emitters.md 4.3): run with .venv-validators/deepspeed/bin/python (torch 2.13.0). Each case:
{"id", "argv": the words after `torchrun` as the launch script runs them (shell-expanded)}. Runs
torch.distributed.run.parse_args + config_from_args, the launcher's own parsing. Facts: nodes, processes per node,
rendezvous backend, node rank, master address/port, and the program torchrun would start."""

from __future__ import annotations

import os

from _harness import serve

RUN = {}
BASE_ENV = dict(os.environ)


def setup() -> None:
    from torch.distributed import run

    RUN["run"] = run


def check(case: dict) -> dict:
    run = RUN["run"]
    os.environ.clear()
    os.environ.update({k: v for k, v in BASE_ENV.items() if not k.startswith("PET_")})
    args = run.parse_args(list(case["argv"]))
    cfg, entry, script_args = run.config_from_args(args)
    return {
        "min_nodes": cfg.min_nodes,
        "max_nodes": cfg.max_nodes,
        "nproc_per_node": cfg.nproc_per_node,
        "rdzv_backend": cfg.rdzv_backend,
        "rdzv_endpoint": cfg.rdzv_endpoint,
        "node_rank": cfg.rdzv_configs.get("rank", args.node_rank),
        "master_addr": getattr(cfg, "master_addr", None) or args.master_addr,
        "master_port": getattr(cfg, "master_port", None) or args.master_port,
        "module": bool(args.module),
        "no_python": bool(args.no_python),
        "training_script": args.training_script,
        "training_script_args": list(args.training_script_args),
        "entrypoint": entry if isinstance(entry, str) else getattr(entry, "__name__", str(entry)),
        "script_args": list(script_args),
    }


if __name__ == "__main__":
    serve(check, setup)
