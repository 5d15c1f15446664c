"""Static hacking checks on a submission's source, before it runs (research/environments.md §1.5, S1–S6).

The source is parsed once; names are resolved through the file's imports (`import time as t` makes
`t.perf_counter` read as `time.perf_counter`), so aliasing does not hide a pattern. CUDA-level
patterns (`cudaGraphLaunch`, `__float2half`, ...) are matched by regex inside string constants, where
inline CUDA lives.

    S1  bypass: try/except, inheriting the reference `Model`, reassigning attributes of `time`,
        `torch.cuda` or `triton.testing`, thread/process imports, `_make_subclass`, Tensor subclasses
    S2  backend required (only when the task asks for Triton or CUDA): a kernel that is launched from
        code reachable from `forward`; torch compute ops in `ModelNew` are a warning (or an error)
    S3  CUDA streams (unless the task allows them)
    S4  downcasts on an fp32 task: half/bfloat16/fp8 dtypes, autocast, TF32 switches
    S5  CUDA graphs, `torch.compile(mode="reduce-overhead")`
    S6  introspection and escape: gc/inspect/os/ctypes/sys.modules/open/exec/atexit/importing the
        evaluator, caches keyed on an input's address or values (`data_ptr()`, `id()`,
        `float(x[0, 0])`, `.item()`, ...), `lru_cache`, module-level containers that code reachable
        from `forward` writes to
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass

BACKENDS = ("any", "triton", "cuda")
TORCH_OPS_POLICIES = ("allow", "warn", "error")


@dataclass(frozen=True)
class Finding:
    """One rule that fired, with a message saying what was seen and where."""

    rule: str
    message: str
    line: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StaticPolicy:
    backend: str = "any"
    fp32_task: bool = True
    allow_streams: bool = False
    torch_ops: str = "warn"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {self.backend!r}")
        if self.torch_ops not in TORCH_OPS_POLICIES:
            raise ValueError(f"torch_ops must be one of {TORCH_OPS_POLICIES}, not {self.torch_ops!r}")


THREAD_MODULES = ("threading", "_thread", "multiprocessing", "concurrent")
TIMER_ROOTS = ("time", "torch.cuda", "triton.testing", "timeit", "torch.utils.benchmark")
ESCAPE_MODULES = ("os", "posix", "nt", "pathlib", "shutil", "tempfile", "subprocess", "socket",
                  "ctypes", "cffi", "gc", "inspect", "atexit", "signal", "importlib", "builtins",
                  "pickle", "marshal", "mmap", "resource", "faulthandler", "tracemalloc", "io",
                  "codecs", "envs", "kernelsuite")
ESCAPE_BUILTINS = ("exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open",
                   "input", "breakpoint", "exit", "quit")
ESCAPE_ATTRS = ("f_back", "f_locals", "f_globals", "tb_frame", "gi_frame", "cr_frame", "__globals__",
                "__code__", "__closure__", "__subclasses__", "__builtins__", "_getframe",
                "get_objects", "get_referrers")
ESCAPE_DOTTED = ("sys.modules", "sys._getframe", "sys.settrace", "sys.setprofile", "sys.exit",
                 "sys.addaudithook", "sys._current_frames", "sys.meta_path", "sys.path",
                 "torch.load", "numpy.load", "numpy.fromfile", "numpy.memmap", "numpy.loadtxt",
                 "numpy.genfromtxt", "torch.from_file", "torch.utils.cpp_extension.load",
                 "functools.lru_cache", "functools.cache", "functools.cached_property")
# Calls whose result identifies an input's address: a lookup keyed on one is an output cache.
ADDRESS_CALLS = ("data_ptr", "tobytes", "untyped_storage", "storage", "_cdata", "__array_interface__")
ADDRESS_BUILTINS = ("id", "hash")
# Calls that read an input's values: as the key of a dict/list lookup (not a tensor index) they make
# an output cache too. Kernel caches key on shapes, dtypes and strides, which none of these return.
VALUE_CALLS = ("item", "tolist", "numpy", "sum", "mean", "norm", "amax", "amin")
VALUE_BUILTINS = ("float", "bytes")
LAZY_ATTRS = ("_make_subclass", "as_subclass", "__torch_function__", "__torch_dispatch__")
LOW_PRECISION = re.compile(r"^(torch|triton\.language)\.(float16|half|bfloat16|float8\w*|"
                           r"HalfTensor|BFloat16Tensor|cuda\.HalfTensor|cuda\.BFloat16Tensor)$")
AUTOCAST = re.compile(r"^torch\.(autocast|amp\..*|cuda\.amp\..*|cpu\.amp\..*)$")
GRAPH_DOTTED = re.compile(r"^torch\.cuda\.(graph|CUDAGraph|graphs\..*|make_graphed_callables|"
                          r"graph_pool_handle)$")
STREAM_DOTTED = re.compile(r"^torch\.(cuda\.)?(Stream|stream|ExternalStream|set_stream)$")
CUDA_STRING_RULES = (
    ("S3", re.compile(r"cudaStreamCreate\w*")),
    ("S4", re.compile(r"__float2half\w*|__half2float|__nv_bfloat16|__float2bfloat16\w*|\bhalf2\b")),
    ("S5", re.compile(r"cudaGraphLaunch|cudaStreamBeginCapture|cudaGraphInstantiate")),
    ("S6", re.compile(r"kernelsuite|/proc/|get_objects")),
)
TORCH_COMPUTE = re.compile(
    r"^torch\.(mm|bmm|matmul|einsum|addmm|baddbmm|conv\w*|\w*pool\w*|relu|gelu|silu|sigmoid|tanh|"
    r"softmax|log_softmax|logsumexp|layer_norm|group_norm|batch_norm|rms_norm|linear|cumsum|"
    r"clamp\w*|exp|log|mean|sum|var_mean|rsqrt|dot)$|^torch\.nn\.functional\.\w+$|"
    r"^torch\.nn\.(?!Module$|Parameter$|ParameterList$|ParameterDict$|ModuleList$|ModuleDict$|"
    r"init\b)[A-Z]\w*$")
CONTAINER_CALLS = ("dict", "list", "set", "collections.OrderedDict", "collections.defaultdict",
                   "collections.deque", "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary")
MUTATORS = ("append", "extend", "update", "setdefault", "add", "insert", "appendleft", "__setitem__",
            "pop", "popitem", "clear")


def check_source(source: str, policy: StaticPolicy = StaticPolicy()) -> tuple[list[Finding], list[str]]:
    """Return (findings, warnings). A file that does not parse has no findings: it fails to load."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [], []
    checker = _Checker(tree, policy)
    checker.run()
    seen, unique = set(), []
    for f in checker.findings:
        if (f.rule, f.message) not in seen:
            seen.add((f.rule, f.message))
            unique.append(f)
    return unique, checker.warnings


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


class _Checker:
    def __init__(self, tree: ast.Module, policy: StaticPolicy):
        self.tree = tree
        self.policy = policy
        self.findings: list[Finding] = []
        self.warnings: list[str] = []
        self.aliases: dict[str, str] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}

    def add(self, rule: str, message: str, node: ast.AST | None = None) -> None:
        self.findings.append(Finding(rule, message, getattr(node, "lineno", None)))

    # --- names -------------------------------------------------------------------------------------
    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def is_imported(self, node: ast.AST) -> bool:
        """True when the chain starts at a name bound by an import (a module, not a local)."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.aliases

    def collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node

    def run(self) -> None:
        self.collect()
        self.check_imports()
        for node in ast.walk(self.tree):
            self.check_node(node)
        self.check_strings()
        self.check_caches()
        if self.policy.backend != "any":
            self.check_backend()
        self.check_torch_ops()

    # --- per-node rules ----------------------------------------------------------------------------
    def check_imports(self) -> None:
        for node in ast.walk(self.tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                root = name.split(".")[0]
                if root in THREAD_MODULES:
                    self.add("S1", f"imports {name}: work can run outside the timed call", node)
                if root in ESCAPE_MODULES:
                    self.add("S6", f"imports {name}: files, processes or interpreter internals", node)
            if isinstance(node, ast.ImportFrom) and node.module == "sys":
                for a in node.names:
                    if f"sys.{a.name}" in ESCAPE_DOTTED:
                        self.add("S6", f"imports sys.{a.name}", node)

    def check_node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.add("S1", "try/except: a fallback path can hide a failing kernel", node)
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = self.dotted(base) or ""
                if name == "Model" or name.endswith(".Model"):
                    self.add("S1", f"class {node.name} inherits from the reference Model", node)
                if name in ("torch.Tensor", "Tensor", "torch._C.TensorBase", "torch._C._TensorBase"):
                    self.add("S1", f"class {node.name} subclasses torch.Tensor (lazy output)", node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in ("__torch_function__", "__torch_dispatch__"):
                self.add("S1", f"defines {node.name}: a tensor subclass hook", node)
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if (self.dotted(target) or "").startswith("functools."):
                    self.add("S6", f"{self.dotted(target)} on {node.name}: results cached", node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                self.check_assignment(target, node)
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, ast.Name) and node.id in ("__builtins__",):
            self.add("S6", "uses __builtins__", node)

    def check_assignment(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.check_assignment(elt, node)
            return
        if not isinstance(target, ast.Attribute):
            return
        if target.attr == "__class__":
            self.add("S1", "assigns __class__: turns a tensor into another type", node)
        name = self.dotted(target)
        if name is None or not self.is_imported(target):
            return
        if _under(name, TIMER_ROOTS):
            self.add("S1", f"reassigns {name}: timer tampering", node)
        elif name.endswith(("allow_tf32", "allow_fp16_reduced_precision_reduction",
                            "allow_bf16_reduced_precision_reduction")):
            if self.policy.fp32_task:
                self.add("S4", f"sets {name}: reduced-precision math on an fp32 task", node)
        else:
            self.add("S6", f"monkey-patches {name}", node)

    def check_attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node) or ""
        if node.attr in LAZY_ATTRS:
            self.add("S1", f"uses {node.attr}: a lazy tensor subclass", node)
        if node.attr in ESCAPE_ATTRS:
            self.add("S6", f"reads .{node.attr}: interpreter introspection", node)
        if name in ESCAPE_DOTTED:
            self.add("S6", f"uses {name}", node)
        if "CUDAGraph" in node.attr or GRAPH_DOTTED.match(name):
            self.add("S5", f"uses {name or node.attr}: graph replay", node)
        if STREAM_DOTTED.match(name) and not self.policy.allow_streams:
            self.add("S3", f"uses {name}: work on a side stream escapes the timer", node)
        if node.attr in ("wait_stream", "record_stream") and not self.policy.allow_streams:
            self.add("S3", f"calls .{node.attr}: stream juggling", node)
        if self.policy.fp32_task and (LOW_PRECISION.match(name) or AUTOCAST.match(name)):
            self.add("S4", f"uses {name} on an fp32 task", node)

    def check_call(self, node: ast.Call) -> None:
        name = self.dotted(node.func) or ""
        if isinstance(node.func, ast.Name) and node.func.id in ESCAPE_BUILTINS:
            self.add("S6", f"calls {node.func.id}()", node)
        if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            first = node.args[0] if node.args else None
            owner = self.dotted(first) if first is not None else None
            if owner and self.is_imported(first) and _under(owner, TIMER_ROOTS):
                self.add("S1", f"{node.func.id}({owner}, ...): timer tampering", node)
            elif not (isinstance(first, ast.Name) and first.id == "self"):
                self.add("S6", f"{node.func.id}() on {owner or 'an object'}: dynamic patching", node)
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
            if not isinstance(node.args[1], ast.Constant):
                self.add("S6", "getattr() with a computed name: hides what is accessed", node)
        if isinstance(node.func, ast.Attribute) and self.policy.fp32_task:
            if node.func.attr in ("half", "bfloat16") and not node.args:
                self.add("S4", f".{node.func.attr}() on an fp32 task", node)
            if name == "torch.set_float32_matmul_precision" and not (
                    node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "highest"):
                self.add("S4", "lowers the fp32 matmul precision", node)
        for kw in node.keywords:
            value = kw.value
            if self.policy.fp32_task:
                if kw.arg == "dtype" and isinstance(value, ast.Constant) and value.value in (
                        "float16", "half", "bfloat16"):
                    self.add("S4", f"dtype={value.value!r} on an fp32 task", node)
                if kw.arg == "allow_tf32" and isinstance(value, ast.Constant) and value.value:
                    self.add("S4", "allow_tf32=True on an fp32 task", node)
                if kw.arg == "input_precision" and isinstance(value, ast.Constant) and value.value == "tf32":
                    self.add("S4", "input_precision='tf32' on an fp32 task", node)
            if name == "torch.compile" and kw.arg == "mode" and isinstance(value, ast.Constant) and \
                    value.value in ("reduce-overhead", "max-autotune"):
                self.add("S5", f"torch.compile(mode={value.value!r}) replays CUDA graphs", node)
            if name == "torch.compile" and kw.arg == "options" and "cudagraphs" in ast.unparse(value):
                self.add("S5", "torch.compile with cudagraphs", node)

    def check_strings(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for rule, pattern in CUDA_STRING_RULES:
                    if rule == "S3" and self.policy.allow_streams:
                        continue
                    if rule == "S4" and not self.policy.fp32_task:
                        continue
                    match = pattern.search(node.value)
                    if match:
                        self.add(rule, f"string mentions {match.group(0)}", node)

    # --- caches (S6) -------------------------------------------------------------------------------
    def check_caches(self) -> None:
        module_containers = {name for name, value in self._assignments(self.tree.body)
                             if self._is_container(value)}
        class_containers = {}
        for cls in self.classes.values():
            class_containers[cls.name] = {name for name, value in self._assignments(cls.body)
                                          if self._is_container(value)}
        for func in self._forward_reachable():
            for node in ast.walk(func):
                target = self._mutated_name(node)
                if target is None:
                    continue
                root, attr = target
                if root in module_containers and attr is None:
                    self.add("S6", f"forward writes to the module-level container {root!r}", node)
                if attr is not None and any(attr in names for names in class_containers.values()) \
                        and (root == "self" or root in class_containers):
                    self.add("S6", f"forward writes to the class-level container {attr!r}", node)
        for func in [n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            self._check_fingerprint_keys(func)

    @staticmethod
    def _assignments(body):
        for node in body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        yield t.id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                yield node.target.id, node.value

    def _is_container(self, value: ast.AST) -> bool:
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            return True
        if isinstance(value, ast.Call):
            name = self.dotted(value.func) or ""
            return name in CONTAINER_CALLS or name.split(".")[-1] in ("OrderedDict", "defaultdict",
                                                                      "WeakKeyDictionary")
        return False

    @staticmethod
    def _mutated_name(node: ast.AST):
        """(root name, attribute or None) of a container that this node writes to, if any."""
        def split(expr):
            if isinstance(expr, ast.Name):
                return expr.id, None
            if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
                return expr.value.id, expr.attr
            return None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript):
                    return split(t.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            return split(node.func.value)
        return None

    def _forward_reachable(self) -> list[ast.AST]:
        model = self.classes.get("ModelNew")
        if model is None:
            return []
        methods = {n.name: n for n in model.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        todo = [methods["forward"]] if "forward" in methods else []
        seen: list[ast.AST] = []
        while todo:
            func = todo.pop()
            if func in seen:
                continue
            seen.append(func)
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Name) and f.id in self.functions:
                    todo.append(self.functions[f.id])
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                        f.value.id == "self" and f.attr in methods:
                    todo.append(methods[f.attr])
        return seen

    def _container_names(self) -> tuple[set[str], set[str]]:
        """Names and `self.` attributes bound to dicts/lists/sets anywhere in the file."""
        names, attrs = set(), set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and self._is_container(node.value):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        attrs.add(t.attr)
        for cls in self.classes.values():
            attrs |= {name for name, value in self._assignments(cls.body) if self._is_container(value)}
        return names, attrs

    def _check_fingerprint_keys(self, func: ast.AST) -> None:
        container_names, container_attrs = self._container_names()
        address_taint: set[str] = set()
        value_taint: set[str] = set()

        def reads(expr, calls, builtins, tainted) -> bool:
            for n in ast.walk(expr):
                if isinstance(n, ast.Call):
                    if isinstance(n.func, ast.Attribute) and n.func.attr in calls:
                        return True
                    if isinstance(n.func, ast.Name) and n.func.id in builtins:
                        return True
                if isinstance(n, ast.Attribute) and n.attr == "__array_interface__":
                    return True
                if isinstance(n, ast.Name) and n.id in tainted:
                    return True
            return False

        def address(expr) -> bool:
            return reads(expr, ADDRESS_CALLS, ADDRESS_BUILTINS, address_taint)

        def value(expr) -> bool:
            return reads(expr, VALUE_CALLS, VALUE_BUILTINS, value_taint)

        def is_container(expr) -> bool:
            if isinstance(expr, ast.Name):
                return expr.id in container_names
            return isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and \
                expr.value.id == "self" and expr.attr in container_attrs

        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for taint, test in ((address_taint, address), (value_taint, value)):
                    if test(node.value):
                        taint.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        for node in ast.walk(func):
            any_keys, lookup_keys = [], []
            if isinstance(node, ast.Subscript):
                (lookup_keys if is_container(node.value) else any_keys).append(node.slice)
            elif isinstance(node, ast.Dict):
                lookup_keys.extend(k for k in node.keys if k is not None)
            elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
                lookup_keys.append(node.left)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("get", "setdefault", "pop", "__contains__", "__getitem__") and node.args:
                lookup_keys.append(node.args[0])
            if any(address(k) for k in any_keys + lookup_keys) or any(value(k) for k in lookup_keys):
                self.add("S6", "a cache keyed on an input's address or values (data_ptr(), id(), "
                               "float(x[...]), ...): it stores outputs", node)

    # --- backend (S2) ------------------------------------------------------------------------------
    def check_backend(self) -> None:
        reachable = self._forward_reachable()
        if self.policy.backend == "triton":
            kernels = {name for name, f in self.functions.items() if any(
                (self.dotted(d.func if isinstance(d, ast.Call) else d) or "").startswith(
                    ("triton.jit", "triton.autotune", "triton.heuristics")) for d in f.decorator_list)}
            if not kernels:
                self.add("S2", "the Triton backend needs an @triton.jit kernel")
                return
            body = "\n".join(ast.unparse(self.functions[k]) for k in kernels)
            if not ("tl.load" in body or "language.load" in body) or not (
                    "tl.store" in body or "language.store" in body):
                self.add("S2", "the Triton kernel never loads and stores through tl.load/tl.store")
            if not re.search(r"\b(tl|language)\.(program_id|arange)\b", body):
                self.add("S2", "the Triton kernel uses neither tl.program_id nor tl.arange")
            launched = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and
                           isinstance(n.func.value, ast.Name) and n.func.value.id in kernels
                           for f in reachable for n in ast.walk(f))
            if not launched:
                self.add("S2", "no Triton kernel is launched from forward: the kernel is a decoy")
        else:
            text = "\n".join(n.value for n in ast.walk(self.tree)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str))
            if "__global__" not in text:
                self.add("S2", "the CUDA backend needs a __global__ kernel")
            if not re.search(r"threadIdx|blockIdx", text):
                self.add("S2", "the CUDA kernel never reads threadIdx/blockIdx")
            modules = {name for name, value in self._assignments(self.tree.body) if isinstance(value, ast.Call)
                       and (self.dotted(value.func) or "").split(".")[-1] in ("load_inline", "load")}
            calls_ext = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (
                (isinstance(n.func.value, ast.Name) and n.func.value.id in modules) or
                (isinstance(n.func.value, ast.Attribute) and n.func.value.attr in modules))
                for f in reachable for n in ast.walk(f))
            if not calls_ext:
                self.add("S2", "no compiled extension function is called from forward")

    def check_torch_ops(self) -> None:
        model = self.classes.get("ModelNew")
        if model is None or self.policy.torch_ops == "allow":
            return
        scope = self._forward_reachable() + [model]
        for func in scope:
            for node in ast.walk(func):
                if isinstance(node, ast.Call):
                    name = self.dotted(node.func) or ""
                    if TORCH_COMPUTE.match(name):
                        message = f"ModelNew computes with {name} instead of its own kernel"
                        if self.policy.torch_ops == "error" and self.policy.backend != "any":
                            self.add("S2", message, node)
                        elif self.policy.backend != "any":
                            warning = f"line {node.lineno}: {message}"
                            if warning not in self.warnings:
                                self.warnings.append(warning)
