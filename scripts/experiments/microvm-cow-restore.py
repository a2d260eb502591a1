"""Experiment (issue 21): restore microVMs from a template whose RAM is a file mapped
copy-on-write, to measure the memory each idle restored VM costs.

    python3 scripts/experiments/microvm-cow-restore.py template     # boot, save (RAM stays in a file)
    python3 scripts/experiments/microvm-cow-restore.py restore 3    # 3 clones, PSS, one exec each

The template runs with its RAM as `memory-backend-file,share=on` and the `x-ignore-shared`
migration capability, so the saved stream holds the device state only (~95 KB) and the RAM
stays in the file. Each clone maps the same file `share=off` (MAP_PRIVATE) and restores the
stream with `-incoming defer` + the same capability. Not Cordon's launcher: no private root,
no seccomp, no uid of its own; the image paths are this host's (see manifest.json).
"""
import json, os, socket, subprocess, sys, time
IMG="/var/lib/cordon/microvm"
D="/tmp/cow"
os.makedirs(D, exist_ok=True)
K=f"{IMG}/vmlinuz-1a7ac0c40b10b983"; I=f"{IMG}/initrd-ae0ce2fbf026d8be.cpio"; R=f"{IMG}/rootfs-953d1d74cc479cf5.ext4"
CMD="console=ttyS0 quiet panic=-1 reboot=t nmi_watchdog=0 random.trust_cpu=on tsc_early_khz=2400000 tsc=reliable no_timer_check lpj=9600000"
MEM=512
def args(tag, share, incoming):
    a=["qemu-system-x86_64","-M","microvm,isa-serial=on,acpi=on,memory-backend=mem","-accel","tcg,thread=multi,tb-size=128","-cpu","max",
       "-nodefaults","-no-user-config","-display","none","-no-reboot","-nic","none","-smp","1","-m",f"{MEM}M",
       "-object",f"memory-backend-file,id=mem,size={MEM}M,mem-path={D}/ram,share={'on' if share else 'off'}",
       "-chardev",f"file,id=con,path={D}/{tag}.console","-serial","chardev:con",
       "-kernel",K,"-initrd",I,"-append",CMD,
       "-drive",f"id=root,file={R},format=raw,if=none,readonly=on","-device","virtio-blk-device,drive=root",
       "-device","virtio-serial-device,max_ports=3",
       "-chardev","null,id=egress","-device","virtserialport,chardev=egress,name=cordon.egress,nr=2",
       "-chardev",f"socket,id=agent,path={D}/{tag}.agent,server=on,wait=off","-device","virtserialport,chardev=agent,name=cordon.agent,nr=1",
       "-qmp",f"unix:{D}/{tag}.qmp,server=on,wait=off"]
    if incoming: a+=["-incoming","defer"]
    return a
class Qmp:
    def __init__(s, path):
        for _ in range(100):
            try:
                s.s=socket.socket(socket.AF_UNIX); s.s.connect(path); break
            except OSError: time.sleep(0.05)
        s.f=s.s.makefile("rw"); s.f.readline(); s.cmd("qmp_capabilities")
    def cmd(s, c, **a):
        s.f.write(json.dumps({"execute":c,"arguments":a})+"\n"); s.f.flush()
        while True:
            r=json.loads(s.f.readline())
            if "return" in r or "error" in r: return r
def pss(pid):
    for l in open(f"/proc/{pid}/smaps_rollup"):
        if l.startswith("Pss:"): return int(l.split()[1])//1024
def agent_wait(tag, timeout=60):
    s=socket.socket(socket.AF_UNIX)
    for _ in range(100):
        try: s.connect(f"{D}/{tag}.agent"); break
        except OSError: time.sleep(0.05)
    s.settimeout(timeout); data=s.recv(4096); return s, data
mode=sys.argv[1]
if mode=="template":
    for f in os.listdir(D):
        if not f.endswith(".py"): os.unlink(f"{D}/{f}")
    p=subprocess.Popen(args("tpl",True,False)); q=Qmp(f"{D}/tpl.qmp")
    t=time.time(); s,data=agent_wait("tpl",120); print("hello after",round(time.time()-t,2),"s",len(data),"bytes")
    time.sleep(1)
    print(q.cmd("migrate-set-capabilities",capabilities=[{"capability":"x-ignore-shared","state":True}]))
    print(q.cmd("migrate",uri=f"exec:cat > {D}/state"))
    while True:
        r=q.cmd("query-migrate")["return"]; 
        if r.get("status") in ("completed","failed"): print(r.get("status"), r.get("error-desc","")); break
        time.sleep(0.1)
    print("template PSS MiB", pss(p.pid)); p.kill(); p.wait()
    print("state bytes", os.path.getsize(f"{D}/state"), "ram file", os.path.getsize(f"{D}/ram"))
else:
    n=int(sys.argv[2]); ps=[]
    for i in range(n):
        tag=f"r{i}"; p=subprocess.Popen(args(tag,False,True)); q=Qmp(f"{D}/{tag}.qmp")
        a=socket.socket(socket.AF_UNIX)
        for _ in range(100):
            try: a.connect(f"{D}/{tag}.agent"); break
            except OSError: time.sleep(0.05)
        print(q.cmd("migrate-set-capabilities",capabilities=[{"capability":"x-ignore-shared","state":True}]))
        t=time.time(); print(q.cmd("migrate-incoming",uri=f"exec:cat {D}/state"))
        while True:
            st=q.cmd("query-status")["return"]["status"]
            if st=="running": break
            if time.time()-t>60: print("status",st); break
            time.sleep(0.02)
        print(tag,"running after",round(time.time()-t,3),"s")
        ps.append((p,q,tag,a))
    time.sleep(5)
    for p,q,tag,a in ps:
        print(tag,"PSS MiB",pss(p.pid), q.cmd("query-status")["return"]["status"])
    import struct
    # a Hello request through the agent protocol: length-prefixed JSON header
    def frame(h, body=b""):
        hb=json.dumps(h).encode(); return struct.pack("<I",4+len(hb)+len(body))+struct.pack("<I",len(hb))+hb+body
    for p,q,tag,a in ps:
        a.settimeout(30)
        a.sendall(frame({"type":"exec","id":1,"argv":["sh","-c","echo hi-from-$(hostname); head -c 100000000 /dev/zero > /tmp/x; echo wrote"],"env":{},"cwd":"/work","stdio":"framed","limits":{"open_files":64,"file_size":200000000,"address_space":0}}))
        a.sendall(frame({"type":"stdin","id":1}))
        t=time.time(); buf=b""
        try:
            while b"exited" not in buf and time.time()-t<30: buf+=a.recv(4096)
            print(tag, "agent said", round(time.time()-t,2), "s", [x for x in buf.split(b"\x00") if b"hi-from" in x or b"wrote" in x][:2] or buf[:300])
        except Exception as e: print(tag, "agent", e)
    for p,q,tag,a in ps:
        print(tag,"PSS MiB",pss(p.pid))
    for p,q,tag,a in ps: p.kill(); p.wait()
