"""How decode-quiet-busy.jsonl was measured: decode tok/s, before/nofit/after x quiet/busy x batch 1/16; a run counts only when the other
processes (the spinner aside) used under 0.1 core on average while it ran."""
import json, os, subprocess, sys, time
PY = "/work/main/.venv/bin/python"
DIRS = {"before": "/tmp/base", "nofit": "/tmp/i11nofit", "after": "/tmp/i11cli"}
OUT = "/tmp/i11_measure3.jsonl"

def cpu_by_pid():
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                out[int(pid)] = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # incl. children
            except Exception:
                pass
    return out

def wait_quiet(limit=900):
    t0 = time.time()
    while time.time() - t0 < limit:
        a = cpu_by_pid(); time.sleep(1); b = cpu_by_pid()
        if sum(b[p] - a.get(p, b[p]) for p in b if p != os.getpid()) / os.sysconf("SC_CLK_TCK") < 0.1:
            return
        time.sleep(3)

def run(ver, batch, busy):
    spinner = subprocess.Popen([PY, "-c", "while True: pass"]) if busy else None
    if busy:
        time.sleep(0.5)
    mine = {os.getpid()} | ({spinner.pid} if spinner else set())
    a, t0 = cpu_by_pid(), time.time()
    p = subprocess.run([PY, "-m", "minipaged.bench", "decode", "--batch", str(batch), "--json"],
                       cwd=DIRS[ver], capture_output=True, text=True)
    b, t1 = cpu_by_pid(), time.time()
    if spinner:
        spinner.kill(); spinner.wait()
    # others: processes alive before and after, not ours, not the bench (a new pid, absent from a)
    others = sum(b[q] - a[q] for q in b if q in a and q not in mine) / os.sysconf("SC_CLK_TCK") / (t1 - t0)
    d = json.loads(p.stdout)
    return d["tokens_per_s"], d.get("blas_threads"), others

for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    for busy in (False, True):
        for ver in DIRS:
            for batch in (1, 16):
                for attempt in range(4):
                    wait_quiet()
                    tok_s, threads, others = run(ver, batch, busy)
                    if others < 0.1:
                        break
                row = {"rep": rep, "cond": "busy" if busy else "quiet", "ver": ver, "batch": batch,
                       "tok_s": round(tok_s, 1), "blas_threads": threads, "others_cores": round(others, 2),
                       "attempts": attempt + 1}
                print(json.dumps(row), flush=True)
                open(OUT, "a").write(json.dumps(row) + "\n")
