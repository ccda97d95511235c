"""The program the Python tool's sandboxed interpreter runs first: privilege drop, audit hook, exec.

`PREAMBLE` is passed with ``-c``; the model's code arrives on stdin. `PROBE_CODE` is what the
tool runs once per configuration to observe which isolation layers are really in effect.
See ``python_sandbox.py`` for what each rule of the hook is for.
"""

# The preamble runs first in the sandboxed interpreter. Its configuration is ``sys.argv[1]``
# (JSON): ``drop`` ([uid, gid] to switch to before anything else, or null), ``read`` (extra
# readable paths), ``hook`` (install the audit hook), ``files`` (how many files, directories
# and links the code may create; the hook counts them with an ``itertools.count``, which the
# code cannot reset even where it reaches the hook's frame). It then installs the audit hook and
# executes the code read from stdin. Everything the hook uses is bound as a default argument so
# that rebinding module globals or builtins from the untrusted code does not affect it.
PREAMBLE = r"""
import sys, os, json, traceback, _imp, itertools
_cfg = json.loads(sys.argv[1])
del sys.argv[1:]
if _cfg["drop"] is not None:
    # Under bubblewrap as root: become the unprivileged uid before any model code runs
    # (setresuid to non-zero ids clears every capability; no_new_privs is already set).
    _u, _g = _cfg["drop"]
    os.setgroups([])
    os.setresgid(_g, _g, _g)
    os.setresuid(_u, _u, _u)
    if os.getresuid() != (_u, _u, _u) or os.getresgid() != (_g, _g, _g) or os.getgroups():
        os._exit(125)
def _install(scratch, stdlib, extra_read, max_files):
    own_proc = "/proc/" + str(os.getpid())
    read_roots = (scratch, own_proc, "/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                  "/dev/urandom", "/usr/share/zoneinfo") + tuple(stdlib) + tuple(extra_read)
    # The hook's path handling uses only built-in (C) functions, bound here: the pure-Python
    # os.path functions look up module globals that the code could rebind (posixpath's
    # helpers, os.lstat), which would let it decide what the hook sees.
    import posix
    def real(path, _lstat=posix.lstat, _readlink=posix.readlink, _OSError=OSError,
             _ValueError=ValueError):
        # os.path.realpath of an absolute path, non-strict: missing parts are kept as given.
        parts = [c for c in path.split("/") if c and c != "."]
        out, hops = "", 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                out = out[:out.rfind("/")] if out else ""
                continue
            cand = out + "/" + name
            try:
                link = (_lstat(cand).st_mode & 0o170000) == 0o120000 and hops < 40
            except (_OSError, _ValueError):
                link = False
            if not link:
                out = cand
                continue
            hops += 1
            target = _readlink(cand)
            if target.startswith("/"):
                out = ""
            parts = [c for c in target.split("/") if c and c != "."] + parts
        return out or "/"
    def isdir(path, _stat=posix.stat, _OSError=OSError, _ValueError=ValueError):
        try:
            return (_stat(path).st_mode & 0o170000) == 0o040000
        except (_OSError, _ValueError):
            return False
    def join(base, rel):
        return base + rel if base.endswith("/") else base + "/" + rel
    def dirname(path):
        return path[:path.rfind("/")] if "/" in path else ""
    def hook(event, args, _scratch=scratch, _read_roots=read_roots, _native_roots=tuple(stdlib),
             _any=any, _len=len, _tuple=tuple, _realpath=real, _isdir=isdir, _join=join,
             _dirname=dirname, _getcwd=posix.getcwd, _lstat=posix.lstat,
             _made=itertools.count(), _next=next, _max_files=max_files, _ValueError=ValueError,
             _CREATE_EVENTS=frozenset({"os.mkdir", "os.symlink", "os.link", "os.mkfifo",
                                       "os.mknod"}), _listdir=posix.listdir,
             _readlink=posix.readlink, _fspath=posix.fspath, _fsenc=sys.getfilesystemencoding(),
             _isinstance=isinstance, _int=int, _str=str, _bytes=bytes, _sep="/",
             _PermissionError=PermissionError, _OSError=OSError, _TypeError=TypeError,
             _hasattr=hasattr, _native_suffixes=tuple(_imp.extension_suffixes()),
             _WRITE_FLAGS=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC,
             _PATH_EVENTS=frozenset({
                 "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.link",
                 "os.chmod", "os.chown", "os.truncate", "os.utime", "os.setxattr",
                 "os.removexattr", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod",
                 "shutil.rmtree", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
                 "shutil.copytree", "shutil.chown", "shutil.move", "shutil.make_archive",
                 "shutil.unpack_archive", "sqlite3.connect"}),
             _READ_EVENTS=frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr"}),
             _DENY=frozenset({
                 "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                 "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
                 "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
                 "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
                 "os.chroot", "webbrowser.open",
                 # another thread's frames would expose the hook's working state
                 "sys._current_frames", "sys._current_exceptions",
                 # a new interpreter starts without this hook
                 "cpython.PyInterpreterState_New",
                 # hand-made code objects are a known way to corrupt the interpreter's memory
                 "code.__new__"}),
             _DENY_PREFIX=("ctypes.", "winreg."),
             _DENY_IMPORT=frozenset({
                 "ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_interpreters",
                 "_xxinterpchannels", "_interpchannels", "_xxinterpqueues", "_interpqueues",
                 "concurrent.interpreters", "_testcapi", "_testinternalcapi", "_testmultiphase",
                 "_testsinglephase", "_testbuffer", "_testclinic", "_testimportmultiple",
                 "_ctypes_test", "_xxtestfuzz"}),
             _DENY_ATTR=frozenset({"__code__", "__globals__", "__closure__", "__defaults__",
                                    "__kwdefaults__"})):
        def deny(what):
            raise _PermissionError("sandbox: " + what + " is not allowed")
        def made(what):
            if _next(_made) >= _max_files:
                deny(what + " beyond " + _str(_max_files) + " new files and directories per call")
        def exists(p):
            try:
                _lstat(p)
                return True
            except (_OSError, _TypeError, _ValueError):
                return False
        def under(full, roots):
            return _any(full == r or full.startswith(r + _sep) for r in roots)
        def resolve(p):
            # Every absolute path `p` may name now: a relative path is resolved against the cwd
            # and against every open directory fd, because the audit event does not say which
            # dir_fd the call uses. None: cannot tell (the fds cannot be listed, e.g. at the
            # RLIMIT_NOFILE limit), so the caller refuses.
            if p is None:
                p = "."
            if _isinstance(p, _int):
                return ()  # an already open file descriptor
            try:
                p = _fspath(p)
            except _TypeError:
                return ()  # not a path
            if _isinstance(p, _bytes):
                p = p.decode(_fsenc, "surrogateescape")
            if p.startswith(_sep):
                return (_realpath(p),)
            bases = [_getcwd()]
            try:
                names = _listdir("/proc/self/fd")
            except _OSError:
                return None
            for n in names:
                try:
                    t = _readlink("/proc/self/fd/" + n)
                except _OSError:
                    continue
                if t.endswith(" (deleted)"):
                    t = t[:-10]  # a removed directory still has its parent
                elif not _isdir(t):
                    continue
                if t.startswith(_sep):
                    bases.append(t)
            return _tuple(_realpath(_join(b, p)) for b in bases)
        def check_write(p, what):
            full = resolve(p)
            if full is None:
                deny(what + " (relative path; open directory fds cannot be listed)")
            for f in full:
                if not (f == "/dev/null" or under(f, (_scratch,))):
                    deny(what)
        def check_read(p):
            full = resolve(p)
            if full is None:
                deny("reading a relative path (open directory fds cannot be listed)")
            for f in full:
                if not under(f, _read_roots):
                    parts = f.split(_sep)
                    if _len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit():
                        deny("reading another process's /proc entry")
                    deny("reading outside the scratch directory and the standard library")
        if event == "open":
            path, mode, flags = args
            if _isinstance(path, _int):
                return
            writing = (mode is not None and _any(c in mode for c in "wax+")) or \
                (_isinstance(flags, _int) and (flags & _WRITE_FLAGS))
            if mode is None:
                # os.open of a directory outside would give a dir_fd for *at() calls
                for f in resolve(path) or ():
                    if not under(f, (_scratch,)) and _isdir(f):
                        deny("opening a directory outside the scratch directory")
            if writing:
                check_write(path, "writing outside the scratch directory")
                if not exists(path):
                    made("creating a file")
            else:
                check_read(path)
        elif event in _CREATE_EVENTS:
            made(event)
            if event == "os.symlink":
                src, dst = args[0], args[1]
                check_write(dst, "os.symlink outside the scratch directory")
                s, d = _fspath(src), _fspath(dst)
                s = s.decode(_fsenc, "surrogateescape") if _isinstance(s, _bytes) else s
                d = d.decode(_fsenc, "surrogateescape") if _isinstance(d, _bytes) else d
                # the link's target is resolved from the directory the link is in
                check_write(s if s.startswith(_sep) else _join(_dirname(d) or ".", s),
                            "a symlink pointing outside the scratch directory")
            else:
                for a in args:
                    if _isinstance(a, (_str, _bytes)) or (a is not None and not _isinstance(a, _int)
                                                          and _hasattr(a, "__fspath__")):
                        check_write(a, event + " outside the scratch directory")
        elif event in _PATH_EVENTS:
            for a in args:
                if _isinstance(a, (_str, _bytes)) or (a is not None and not _isinstance(a, _int)
                                                      and _hasattr(a, "__fspath__")):
                    check_write(a, event + " outside the scratch directory")
        elif event in _READ_EVENTS:
            check_read(args[0])
        elif event.startswith("socket."):
            deny("network access (" + event + ")")
        elif event in _DENY or event.startswith(_DENY_PREFIX):
            deny(event)
        elif event == "import":
            if args[0] in _DENY_IMPORT:
                deny("importing " + args[0])
            fn = args[1]
            if _isinstance(fn, _str) and fn.endswith(_native_suffixes):
                full = resolve(fn)
                if not full or _any(not under(f, _native_roots) for f in full):
                    deny("loading native code from outside the standard library")
        elif event == "object.__setattr__" and _len(args) > 1 and args[1] in _DENY_ATTR:
            deny("rebinding " + args[1])
    sys.addaudithook(hook)
if _cfg["hook"]:
    _install(os.path.realpath(os.getcwd()),
             [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)],
             [os.path.realpath(p) for p in _cfg["read"]], _cfg["files"])
del _install, _cfg
_src = sys.stdin.read()
sys.stdin.close()
_globals = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_src, "<code>", "exec"), _globals)
except SystemExit:
    raise
except BaseException as _e:
    try:
        sys.stdout.flush()  # what the program printed before the error comes first
    except BaseException:
        pass
    # Print the traceback without the preamble's own frames (file "<string>").
    _frames = [f for f in traceback.extract_tb(_e.__traceback__) if f.filename != "<string>"]
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(_frames))
                     + "".join(traceback.format_exception_only(type(_e), _e)))
    sys.stderr.flush()
    os._exit(1)
"""

# Run in the sandbox at probe time: what the code actually observes, for `capabilities()`.
PROBE_CODE = r"""
import json, os
import decimal, textwrap  # the standard library and its extension modules are readable
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
nets = [l.split(":")[0].strip() for l in open("/proc/self/net/dev").readlines()[2:]]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "nets": nets,
                  "seccomp": status.get("Seccomp", "").strip(),
                  "no_new_privs": status.get("NoNewPrivs", "").strip(),
                  "canary_visible": CANARY is not None and os.path.exists(CANARY)}))
"""
