"""pytest fixtures for the Strata end-to-end suite; see harness.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import Server, ServerSpec, _short_tmpdir


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    if rep.failed:
        for srv in getattr(item, "_strata_servers", []):
            text = "".join(f"--- earlier run ---\n{h}\n" for h in srv.history) + srv.stderr_text()
            rep.sections.append((f"server stderr ({srv.stderr_path})", text[-20000:] or "(empty)"))
            out = srv.stdout_text()
            if out:
                rep.sections.append((f"server stdout ({srv.stdout_path})", out[-5000:]))


@pytest.fixture
def server_factory(request):
    """start(spec=None, **kwargs) -> running Server.  All are stopped at teardown,
    and each must exit 0 on SIGTERM (a crash or a bad exit fails the test)."""
    servers: list[Server] = []
    dirs: list[Path] = []
    request.node._strata_servers = servers

    def start(spec: ServerSpec | None = None, **kw) -> Server:
        spec = spec or ServerSpec(**kw)
        d = _short_tmpdir()
        dirs.append(d)
        srv = Server(d, spec, name=f"srv{len(servers)}")
        servers.append(srv)
        return srv.start()

    yield start

    problems = []
    for srv in servers:
        if srv.proc is None or srv.stopped:
            continue
        was_running = srv.proc.poll() is None
        try:
            rc = srv.stop()
        except AssertionError as e:
            problems.append(str(e))
            continue
        if not was_running:
            problems.append(f"server {srv.stderr_path} was no longer running at teardown (exit {rc})")
        elif rc != 0:
            problems.append(f"server exited {rc} on SIGTERM")
    if problems:
        for srv in servers:
            print(f"--- server stderr {srv.stderr_path} ---\n{srv.stderr_text()[-20000:]}")
        pytest.fail("; ".join(problems))
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(server_factory) -> Server:
    """One 256 MiB disk d0 exported as `vol` on a unix socket."""
    return server_factory()


@pytest.fixture
def workdir():
    d = _short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


