"""A real multi-process run: 2 processes on 127.0.0.1, 2 CPU devices each, 2x2 mesh.

Each process is a subprocess with its own ``XLA_FLAGS`` and the gloo CPU collectives;
they factor, solve and differentiate a sharded matrix, and process 0 writes the results
(gathered to the host) for comparison with a single-process computation here.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

WORKER = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    from gpchol import distributed as gd

    n, T = 48, 10
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    A = m @ m.T / n + np.eye(n)
    b = rng.standard_normal(n)
    mesh = jax.make_mesh((2, 2), ("r", "c"))
    s = NamedSharding(mesh, P("r", "c"))
    a = jax.make_array_from_callback((n, n), s, lambda idx: A[idx])
    L, status = gd.potrf(a, T, return_status=True)
    x = gd.potrs(L, b, T)
    def f(a):
        L = gd.potrf(a, T, donate=False)
        return gd.logdet(L) + jnp.sum(gd.potrs(L, b, T) ** 2)
    with jax.set_mesh(mesh):
        g = jax.jit(jax.grad(f))(jax.make_array_from_callback((n, n), s, lambda idx: A[idx]))
    res = dict(
        status=int(status),
        donated=bool(a.is_deleted()),
        L=np.asarray(multihost_utils.process_allgather(L, tiled=True)).tolist(),
        x=np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist(),
        g=np.asarray(multihost_utils.process_allgather(g, tiled=True)).tolist(),
        processes=jax.process_count(),
        devices=jax.device_count(),
    )
    if pid == 0:
        with open(out, "w") as fh:
            json.dump(res, fh)
    jax.distributed.shutdown()
    """
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_factor_solve_grad(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), port, str(i), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multi-process workers timed out")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    res = json.loads(out.read_text())
    assert res["processes"] == 2 and res["devices"] == 4
    assert res["status"] == 0 and res["donated"]

    # the same computation in one process (single device)
    n = 48
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    A = m @ m.T / n + np.eye(n)
    b = rng.standard_normal(n)
    np.testing.assert_allclose(res["L"], np.linalg.cholesky(A), atol=1e-12)
    np.testing.assert_allclose(res["x"], np.linalg.solve(A, b), atol=1e-10)

    def f(a):
        L = jnp.linalg.cholesky(a)
        x = jax.scipy.linalg.cho_solve((L, True), b)
        return 2 * jnp.sum(jnp.log(jnp.diag(L))) + jnp.sum(x**2)

    np.testing.assert_allclose(res["g"], jax.grad(f)(jnp.asarray(A)), atol=1e-10)
