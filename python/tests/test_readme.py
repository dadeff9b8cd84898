"""README.md as a new user pastes it, in order (issue 24 item 1): the key and `kvx serve` lines
of "Moving bytes", then the Python block of "From Python", run from the source tree in a home of
the test's own. The commands are read out of README.md, so the README cannot drift from what
works."""
import os
import pathlib
import re
import select
import signal
import subprocess
import sys
import time

SOURCE = pathlib.Path(os.environ.get("KVX_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BINARY = pathlib.Path(os.environ.get("KVX_BINARY_DIR", SOURCE / "build"))


def readme_section(title):
    text = (SOURCE / "README.md").read_text()
    start = text.index("\n## " + title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def code_blocks(section, language):
    return re.findall(r"```" + language + r"\n(.*?)```", section, re.S)


def shell_commands(block):
    """The `$ ` lines of a console block, continuation lines joined, `build/` made this build's."""
    joined, pending = [], ""
    for line in block.splitlines():
        if pending or line.startswith("$ "):
            pending += (line[2:] if line.startswith("$ ") and not pending else line.strip())
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            joined.append(pending.replace("build/kvx", str(BINARY / "kvx")))
            pending = ""
    return joined


def wait_for_line(process, prefix, deadline_s):
    """The first line of `process`'s stdout starting with `prefix`, or a failure at the deadline."""
    end = time.monotonic() + deadline_s
    seen = []
    while time.monotonic() < end:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError("no %r line from kvx serve within %d s; it printed %r"
                         % (prefix, deadline_s, seen))


def test_the_readme_python_example_pulls_from_the_readme_kvx_serve(tmp_path):
    commands = shell_commands(code_blocks(readme_section("Moving bytes"), "")[0])
    key = next(c for c in commands if " auth-key " in c)
    serve = next(c for c in commands if " serve " in c).rstrip().rstrip("&").rstrip()
    example = code_blocks(readme_section("From Python"), "python")[0]
    env = dict(os.environ, HOME=str(tmp_path), UCX_NET_DEVICES="lo")
    subprocess.run(["bash", "-c", key], cwd=SOURCE, env=env, check=True, timeout=60)
    server = subprocess.Popen(["bash", "-c", "exec " + serve], cwd=SOURCE, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        wait_for_line(server, "serving", 600)  # it fills its cache first
        run = subprocess.run([sys.executable, "-c", example], cwd=SOURCE, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert re.fullmatch(r"\d+ bytes, [0-9.e-]+ s, over .+\n", run.stdout), run.stdout
        assert int(run.stdout.split()[0]) > 0
        # the layout's storage says "vram", numpy's memory is host memory: noted, not refused
        assert 'storage kv_cache is "vram" in the layout; its memory is host memory' in run.stderr
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
