# Cordon's bash context driver: one long-lived bash whose state (variables, functions, the
# working directory) lasts from cell to cell, run by `python3 -c <this>` in the sandbox (a
# background exec, under every limit of the sandbox). The protocol is driver.py's: requests
# on stdin, one JSON object a line; frames on stdout, "\x1ecordon " + JSON a line
# (contexts/frames.rs). Each cell is a file the shell sources with stdin from /dev/null;
# the shell writes the cell's status on a pipe of its own when the cell ends.
import os, sys


def _driver():
    import json, re, select, shlex, signal, subprocess, tempfile, threading, time

    mark = b"\x1ecordon "
    proto_out = os.dup(1)
    proto_in = os.dup(0)
    me = os.getpid()
    wlock = threading.Lock()
    cells = tempfile.mkdtemp(prefix=".cordon-bash-", dir="/tmp")
    st = {"count": 0, "cell": 0, "timed_out": False}

    def send(obj):
        line = mark + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "replace") + b"\n"
        with wlock:
            view = memoryview(line)
            while view:
                view = view[os.write(proto_out, view):]

    def start():
        status_r, status_w = os.pipe()
        sh = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True, bufsize=0)
        os.close(status_w)
        # An interrupt ends the cell's foreground command, not the shell.
        sh.stdin.write(f"trap : INT\nexec 3>&{status_w} {status_w}>&-\n".encode())
        for f in (sh.stdout, sh.stderr):
            os.set_blocking(f.fileno(), False)
        return sh, status_r

    sh, status_r = start()

    def relay(f, name, cell):
        got = False
        while True:
            try:
                b = os.read(f.fileno(), 65536)
            except (BlockingIOError, InterruptedError):
                return got
            if not b:
                return got
            got = True
            send({"t": "stream", "cell": cell, "name": name,
                  "text": b.decode("utf-8", "replace")})

    def run(cell, code, timeout_ms, env):
        nonlocal sh, status_r
        st["count"] += 1
        st["cell"], st["timed_out"] = cell, False
        path = os.path.join(cells, "cell")
        with open(path, "w") as f:
            f.write(code)
        # A cell's own environment (run_code's envs): set while it runs, then the shell's
        # values (or their absence) come back.
        pre, post = [], []
        for i, (k, v) in enumerate(env.items()):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                continue
            pre.append(f"__cordon_s{i}=${{{k}+1}}; __cordon_v{i}=${{{k}-}}; "
                       f"export {k}={shlex.quote(v)}")
            post.append(f'if [ -n "$__cordon_s{i}" ]; then export {k}="$__cordon_v{i}"; '
                        f"else unset {k}; fi; unset __cordon_s{i} __cordon_v{i}")
        script = "\n".join(pre + [f". {shlex.quote(path)} </dev/null; __cordon_rc=$?"]
                           + post + ['printf "%s\\n" "$__cordon_rc" >&3', ""])
        deadline = time.monotonic() + timeout_ms / 1000.0
        status, error, rc = "ok", None, None
        try:
            sh.stdin.write(script.encode())
        except OSError:
            pass
        buf = b""
        fds = [sh.stdout.fileno(), sh.stderr.fileno(), status_r]
        while rc is None:
            left = deadline - time.monotonic()
            if left <= 0 and not st["timed_out"]:
                st["timed_out"] = True
                interrupt(cell)
                left = 5.0
                deadline = time.monotonic() + left
            elif left <= 0:
                break
            ready, _, _ = select.select(fds, [], [], left)
            relay(sh.stdout, "stdout", cell)
            relay(sh.stderr, "stderr", cell)
            if status_r in ready:
                b = os.read(status_r, 64)
                if not b:
                    break
                buf += b
                if b"\n" in buf:
                    rc = int(buf.split(b"\n", 1)[0] or b"0")
        relay(sh.stdout, "stdout", cell)
        relay(sh.stderr, "stderr", cell)
        if rc is None:
            # The shell ended (`exit` in a cell) or would not stop: a new one takes its place.
            try:
                os.killpg(sh.pid, signal.SIGKILL)
            except OSError:
                pass
            sh.wait()
            os.close(status_r)
            sh, status_r = start()
            status = "error"
            error = {"name": "ShellExited",
                     "value": "the cell ended its shell; a new shell took its place and "
                              "earlier variables are gone", "traceback": ""}
        if st["timed_out"]:
            status = "timeout"
            error = {"name": "TimeoutError",
                     "value": f"the cell ran past its timeout of {timeout_ms} ms and was "
                              "interrupted; the context keeps its state", "traceback": ""}
        elif rc:
            status = "error"
            error = {"name": "ExitStatus", "value": str(rc),
                     "traceback": f"the cell's last command exited with status {rc}\n"}
        send({"t": "done", "cell": cell, "status": status, "error": error,
              "count": st["count"]})

    def interrupt(cell):
        if st["cell"] == cell:
            try:
                os.killpg(sh.pid, signal.SIGINT)
            except OSError:
                pass

    pending = []
    avail = threading.Semaphore(0)

    def requests():
        buf = b""
        while True:
            try:
                b = os.read(proto_in, 65536)
            except InterruptedError:
                continue
            if not b:
                try:
                    os.killpg(sh.pid, signal.SIGKILL)
                except OSError:
                    pass
                os._exit(0)
            buf += b
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if req["op"] == "interrupt":
                    st["timed_out"] = True
                    interrupt(req["cell"])
                else:
                    pending.append(req)
                    avail.release()

    threading.Thread(target=requests, daemon=True).start()
    version = subprocess.run(["bash", "-c", "echo $BASH_VERSION"], capture_output=True,
                             text=True).stdout.strip()
    send({"t": "ready", "lang": "bash", "version": version, "pid": me})
    while True:
        avail.acquire()
        req = pending.pop(0)
        run(req["cell"], req["code"], req["timeout_ms"], req.get("env") or {})


_driver()
