"""Install each Linux package into a scratch place, start it, answer a chat over HTTP, remove it.

    python3 packaging/smoke_test.py            # after packaging/build_linux.py
    python3 packaging/smoke_test.py --program dist/localinfer/localinfer   # one bundle, as is

The tarball is unpacked into a temporary folder; the .deb is installed with dpkg into a
scratch root (its own dpkg database, so this machine's packages are untouched) and removed
again. Each installed program then, with a fresh LOCALINFER_HOME and no network:
`--version`; `hw --json` names a CPU device (and, for a build whose backends load at run
time, exactly one CPU library loaded); `serve` answers an OpenAI chat with the embedded model
and serves the web app; `app --no-browser` names a launch page only its user can read (the key
is not in its output), refuses a request without that key and answers one with it; SIGTERM
ends both cleanly. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "pkg" / "out"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", type=Path,
                        help="check this installed program only (the macOS and Windows "
                             "workflows: dist/localinfer/localinfer[.exe])")
    args = parser.parse_args()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    if args.program:
        with tempfile.TemporaryDirectory(prefix="localinfer-smoke-") as scratch:
            exercise(args.program.resolve(), version, Path(scratch) / "home")
        print("smoke test passed")
        return 0
    tarballs = sorted(OUT.glob(f"localinfer-{version}-linux-*.tar.gz"))
    debs = sorted(OUT.glob(f"localinfer_{version}_*.deb"))
    if not tarballs or not debs:
        print(f"no packages of {version} in {OUT} — run packaging/build_linux.py first",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="localinfer-smoke-") as scratch:
        check_tarball(tarballs[-1], version, Path(scratch) / "tar")
        check_deb(debs[-1], version, Path(scratch) / "deb")
    print("smoke test passed")
    return 0


def check_tarball(archive: Path, version: str, scratch: Path) -> None:
    print(f"== {archive.name}: unpack, run, delete")
    scratch.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
    exercise(scratch / f"localinfer-{version}" / "localinfer", version, scratch / "home")


def check_deb(package: Path, version: str, scratch: Path) -> None:
    print(f"== {package.name}: install into a scratch root, run, remove")
    root = scratch / "root"
    admin = root / "var" / "lib" / "dpkg"
    for sub in ("info", "updates", "triggers"):
        (admin / sub).mkdir(parents=True)
    (admin / "status").touch()
    # the scratch root has no libc6 package to satisfy Depends; this machine's libc serves
    dpkg = ["dpkg", f"--root={root}", "--force-depends", "--force-script-chrootless"]
    _run(*dpkg, "--install", package)
    launcher = root / "usr" / "bin" / "localinfer"
    _expect(os.readlink(launcher) == "/opt/localinfer/localinfer",
            f"/usr/bin/localinfer points to {os.readlink(launcher)}")
    desktop = root / "usr" / "share" / "applications" / "localinfer.desktop"
    _expect("Exec=localinfer app" in desktop.read_text(), "the desktop entry starts the app")
    if shutil.which("desktop-file-validate"):
        _run("desktop-file-validate", desktop)
    _expect((root / "usr/share/icons/hicolor/256x256/apps/localinfer.png").is_file(), "icon")
    exercise(root / "opt" / "localinfer" / "localinfer", version, scratch / "home")
    _run(*dpkg, "--remove", "localinfer")
    left = [p for p in (root / "opt" / "localinfer", launcher, desktop) if os.path.lexists(p)]
    _expect(not left, f"removed without leftovers (left: {left})")


def exercise(program: Path, version: str, home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LOCALINFER_HOME": str(home), "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    shown = _output(program, "--version", env=env)
    _expect(version in shown, f"--version says {shown.strip()!r}")
    hw = json.loads(_output(program, "hw", "--json", env=env))
    _expect(any(d["kind"] == "cpu" for d in hw["devices"]), f"hw names a CPU: {hw['devices']}")
    libraries = hw["backend_libraries"]
    if libraries:
        cpu_loaded = [lib["name"] for lib in libraries
                      if lib["name"].startswith("ggml-cpu") and lib["loaded"]]
        _expect(len(cpu_loaded) == 1, f"one CPU backend library loaded: {cpu_loaded}")
        print(f"   {len(libraries)} backend libraries, loaded: {cpu_loaded}")
    # llama.cpp's RPC backend comes built in the bundle (it has no pip, maybe no compiler)
    if sys.platform != "win32":
        _expect(hw["rpc"]["built"], f"the bundle carries the RPC backend: {hw['rpc']}")
    check_serve(program, env)
    check_app(program, env)


def check_serve(program: Path, env: dict[str, str]) -> None:
    port = _free_port()
    started = time.monotonic()
    server = subprocess.Popen([program, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_until_up(f"{base}/api/version", server)
        print(f"   serve up in {time.monotonic() - started:.1f} s")
        maps = Path(f"/proc/{server.pid}/maps")
        if maps.exists():  # the bundle carries uvicorn's fast parts, and uvicorn took them
            loaded = maps.read_text()
            _expect("/httptools/" in loaded and "/uvloop/" in loaded, "httptools and uvloop")
        reply = _post(f"{base}/v1/chat/completions", {
            "model": "smollm2:135m", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        text = reply["choices"][0]["message"]["content"]
        _expect(text.strip() and reply["usage"]["completion_tokens"] > 0, f"a reply: {reply}")
        print(f"   chat answered: {text.strip()[:60]!r}")
        page = _get(f"{base}/", accept="text/html")
        _expect("<title>localinfer</title>" in page, "the web app's page at /")
        _expect("marked" in _get(f"{base}/ui/vendor/marked.umd.js"), "its scripts ship inside")
    finally:
        _stop(server)


def check_app(program: Path, env: dict[str, str]) -> None:
    app = subprocess.Popen([program, "app", "--no-browser"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        # "localinfer app: open file:///…/localinfer-app-….html (it forwards to
        # http://127.0.0.1:PORT with this launch's key; only you can read it)": the key is
        # not on stdout (a pipe here, which may be a log), only in that file
        line = app.stdout.readline()
        found = re.fullmatch(r"localinfer app: open (file://\S+) \(it forwards to "
                             r"(http://127\.0\.0\.1:\d+) with this launch's key; .*\)\n", line)
        _expect(found and "key=" not in line, f"app printed {line!r}")
        launch = Path(urllib.request.url2pathname(urllib.parse.urlsplit(found[1]).path))
        _expect(sys.platform == "win32" or launch.stat().st_mode & 0o077 == 0,
                f"{launch} is this user's alone")
        page, key = re.search(r'"(http://127\.0\.0\.1:\d+)/#key=([^"]+)"',
                              launch.read_text("utf-8")).groups()
        _expect(page == found[2], f"the launch page forwards to {page}, the line says {found[2]}")
        _wait_until_up(f"{page}/health", app)
        try:
            _get(f"{page}/v1/models")
            _expect(False, "a request without the launch key was answered")
        except urllib.error.HTTPError as exc:
            _expect(exc.code == 401, f"without the key: {exc.code}")
        models = json.loads(_get(f"{page}/v1/models", key=key))
        _expect(any(m["id"] == "smollm2:135m" for m in models["data"]), f"models: {models}")
        print("   app: refuses requests without its launch key, answers with it")
    finally:
        _stop(app)
    _expect(not launch.exists(), f"{launch} removed when the app stopped")


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit("FAILED: did not stop within 20 s of SIGTERM")
    # the server re-raises SIGTERM once it has shut down, as uvicorn does: -15 is a clean end
    # (Windows has no SIGTERM: send_signal terminates the process outright)
    _expect(code in (0, -signal.SIGTERM) or sys.platform == "win32",
            f"stopped by SIGTERM with exit code {code}")
    err = process.stderr.read() if process.stderr else ""
    _expect("Traceback" not in err, f"a traceback on the way out: {err[-2000:]}")


def _wait_until_up(url: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = process.stderr.read() if process.stderr else ""
            raise SystemExit(f"FAILED: it exited with {process.returncode}: {err[-2000:]}")
        try:
            _get(url)
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    raise SystemExit(f"FAILED: nothing answered at {url} within {timeout:.0f} s")


def _get(url: str, accept: str = "*/*", key: str | None = None) -> str:
    headers = {"Accept": accept, **({"Authorization": f"Bearer {key}"} if key else {})}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _output(*cmd: str | Path, env: dict[str, str]) -> str:
    return subprocess.run([str(c) for c in cmd], env=env, check=True, capture_output=True,
                          text=True, timeout=120).stdout


def _run(*cmd: str | Path) -> None:
    print("   +", " ".join(map(str, cmd)))
    subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)


def _expect(ok: object, what: str) -> None:
    if not ok:
        raise SystemExit(f"FAILED: {what}")


if __name__ == "__main__":
    sys.exit(main())
