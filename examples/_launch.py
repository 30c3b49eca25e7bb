"""Shared plumbing of the multi-process examples: arguments, launcher, initialization.

Not an example itself. ``--launch N`` re-runs the calling script as N local processes on
127.0.0.1 (free port, each with ``--local-devices`` simulated CPU devices); otherwise the
script joins the job given by ``--coordinator/--num-processes/--process-id``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

HOW_TO = """\
How to run:
  one process, simulated devices:   python {s} --local-devices 4
  N processes on this machine:      python {s} --launch 2 --local-devices 2
  several machines (one process each, run on every machine with its own --process-id):
      python {s} --coordinator HOST0:12345 --num-processes 2 --process-id 0
  (on GPUs drop --local-devices; each process uses its GPUs; on CPUs the processes talk
  through gloo)
"""


def parser(description, script):
    p = argparse.ArgumentParser(
        description=description,
        epilog=HOW_TO.format(s="examples/" + os.path.basename(script)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, default=128, help="matrix size (default 128)")
    p.add_argument("--tile", type=int, default=32, help="tile size T_A (default 32)")
    p.add_argument("--mesh", default=None, help="process grid 'PrxPc' (default: near square)")
    p.add_argument("--launch", type=int, default=0, help="spawn N local processes")
    p.add_argument("--local-devices", type=int, default=0, help="simulated CPU devices")
    p.add_argument("--coordinator", default=None, help="HOST:PORT of process 0")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, script):
    """Spawn ``args.launch`` copies of ``script``; return the worst exit code."""
    port = free_port()
    env = dict(os.environ)
    ndev = args.local_devices or 2
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ndev}"
    base = [sys.executable, script, "--n", str(args.n), "--tile", str(args.tile)]
    if args.mesh:
        base += ["--mesh", args.mesh]
    procs = [
        subprocess.Popen(
            [
                *base,
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                str(args.launch),
                "--process-id",
                str(i),
            ],
            env=env,
        )
        for i in range(args.launch)
    ]
    return max(p.wait() for p in procs)


def init(args):
    """Set devices / distributed runtime before JAX starts; return the ``jax`` module."""
    if args.local_devices and "xla_force_host_platform_device_count" not in os.environ.get(
        "XLA_FLAGS", ""
    ):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.local_devices}"
        )
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.coordinator:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            args.coordinator, num_processes=args.num_processes, process_id=args.process_id
        )
    return jax


def make_mesh(jax, spec):
    n = jax.device_count()
    if spec:
        pr, pc = (int(x) for x in spec.lower().split("x"))
    else:
        pr = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
        pc = n // pr
    return jax.make_mesh((pr, pc), ("r", "c"))


def run(body, doc, script):
    """Parse the arguments, then launch local processes or run ``body`` in this one.

    With ``--launch N`` the script is re-run as ``N`` local processes; otherwise the
    simulated devices and the distributed runtime are set up before JAX starts, and
    ``body`` runs on the process grid given by ``--mesh``.

    Args:
        body: the example, called as ``body(jax, args, mesh)`` with the ``jax`` module,
            the parsed arguments and the ``("r", "c")`` mesh over all devices.
        doc: the example's module docstring; its first line is the ``--help`` description.
        script: the example's ``__file__``.

    Returns:
        The exit status: with ``--launch``, the worst of the processes'; otherwise 0.
    """
    args = parser(doc.splitlines()[0], script).parse_args()
    if args.launch:
        return launch(args, os.path.abspath(script))
    jax = init(args)
    body(jax, args, make_mesh(jax, args.mesh))
    return 0
