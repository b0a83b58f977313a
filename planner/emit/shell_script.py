"""A shell launch script read without running it: the flags of its training command (``read_script``) and the world
size its torchrun line gives (``launch_world``), for the Megatron-LM importer (planner/emit/megatron_import.py).

Literal values only: variables assigned literally in the file (scalars, arrays, ``$((...))`` arithmetic,
``${X:-default}``) are substituted as bash would; control flow (if/for/case) is not evaluated, its bodies are read
as straight-line code. Sources: the bash manual (parameter expansion, arithmetic expansion, word splitting of
unquoted expansions); torchrun's --nnodes/--nproc-per-node/--standalone (shared/reference/emitters.md 4.3).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.errors import SpecError


@dataclass
class Script:
    """The training command of a launch script: its flags, the launcher before it, the literal variables."""

    flags: list[str]
    launcher: list[str]  # tokens before the .py of the training command (torchrun and its flags)
    variables: dict[str, str]
    where: str


_LAUNCHERS = {"torchrun", "python", "python3", "torch.distributed.run", "torch.distributed.launch"}
_CONTROL = {"if", "then", "else", "elif", "fi", "for", "do", "done", "while", "until", "case", "esac", "function"}
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_ARRAY = re.compile(r"^\s*(?:export\s+|declare\s+-a\s+|local\s+)?([A-Za-z_]\w*)(\+?)=\((.*)\)\s*(?:#.*)?$", re.S)


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and multi-line array assignments `X=( ... )` kept whole."""
    text = re.sub(r"\\\r?\n", " ", text.replace("\r\n", "\n"))
    out: list[str] = []
    buf: list[str] = []
    depth = 0
    for line in text.split("\n"):
        code = _strip_comment(line)
        if buf:
            buf.append(line)
            depth += code.count("(") - code.count(")")
            if depth <= 0:
                out.append("\n".join(buf))
                buf, depth = [], 0
            continue
        if re.match(r"^\s*(?:export\s+|declare\s+-a\s+|local\s+)?[A-Za-z_]\w*\+?=\(", code):
            depth = code.count("(") - code.count(")")
            if depth > 0:
                buf = [line]
                continue
        out.append(line)
    if buf:
        out.append("\n".join(buf))
    return out


def _strip_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes, at a word start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise SpecError(where, f"cannot split shell words ({exc}): {text.strip()[:80]!r}")


_VAR = re.compile(
    r"\$\(\((?P<arith>[^()]*(?:\([^()]*\)[^()]*)*)\)\)"
    r"|\$\{(?P<name>[A-Za-z_]\w*)(?P<index>\[[@*]\])?(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_]\w*)"
)


def _expand(word: str, variables: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """A word with literally assigned variables substituted; anything else (``$1``, ``$(cmd)``, unknown names) is
    left as written, so that a value that matters is refused as not literal."""

    def sub(mt: re.Match) -> str:
        if mt.group("arith") is not None:
            expr = _expand(mt.group("arith"), variables, arrays).replace("$", "")
            value = _arith(expr)
            return mt.group(0) if value is None else str(value)
        name = mt.group("name") or mt.group("bare")
        if mt.group("index"):
            return " ".join(arrays[name]) if name in arrays else mt.group(0)
        if name in variables and (variables[name] != "" or mt.group("op") != ":-"):
            return variables[name]
        if name in arrays:
            return arrays[name][0] if arrays[name] else ""
        if mt.group("op"):
            return _expand(mt.group("default") or "", variables, arrays)
        return mt.group(0)

    return _VAR.sub(sub, word)


def _arith(expr: str) -> int | None:
    """An integer shell arithmetic expression (+ - * / % and parentheses), None otherwise."""
    if not re.fullmatch(r"[\d\s+\-*/%()]+", expr or ""):
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)]
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b:
                return a // b if not isinstance(node.op, ast.Mod) else a % b
        raise ValueError

    try:
        return value(tree)
    except (ValueError, RecursionError):
        return None


def _words(tokens: list[str], variables: dict[str, str], arrays: dict[str, list[str]]) -> list[str]:
    """Tokens after substitution, split into words at white space as bash splits an unquoted expansion (an array
    or a variable holding several flags gives several words)."""
    out: list[str] = []
    for token in tokens:
        expanded = _expand(token, variables, arrays)
        out.extend([token] if expanded == token else expanded.split())
    return out


def read_script(text: str, where: str, program: str) -> Script:
    """The flags of the training command of a shell script (the first ``program`` command, else the first python
    command), or of an args file (no command: every flag line)."""
    variables: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    command: tuple[list[str], str, list[str]] | None = None
    loose: list[str] = []
    for line in _logical_lines(text):
        code = line.strip()
        if not code or code.startswith("#"):
            continue
        arr = _ARRAY.match(code)
        if arr:
            name, append, inner = arr.groups()
            elements = []
            for element in _split(inner, where):
                elements.append(_expand(element, variables, arrays))
            arrays[name] = (arrays.get(name, []) if append else []) + elements
            continue
        tokens = _split(code, where)
        if not tokens:
            continue
        if tokens[0] in _CONTROL or tokens[0] in ("{", "}") or tokens[0].endswith("()"):
            tokens = tokens[1:]  # control flow is not evaluated: its bodies are read as straight-line code
            while tokens and tokens[0] in _CONTROL:
                tokens = tokens[1:]
            if not tokens or tokens[0].startswith("["):
                continue
        if tokens[0] in ("export", "declare", "local", "readonly"):
            tokens = [t for t in tokens[1:] if not t.startswith("-")]
        env_prefix = []
        while tokens and _ASSIGN.match(tokens[0]):
            env_prefix.append(tokens.pop(0))
        for assignment in env_prefix:
            name, append, value = _ASSIGN.match(assignment).groups()
            value = _expand(value, variables, arrays)
            variables[name] = variables.get(name, "") + value if append else value
        if not tokens:
            continue
        words = _words(tokens, variables, arrays)
        script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        if script_at is not None and (
            words[script_at].endswith(program) or Path(words[0]).name in _LAUNCHERS or "-m" in words[:script_at]
        ):
            found = (words[:script_at], words[script_at], words[script_at + 1 :])
            if command is None or (found[1].endswith(program) and not command[1].endswith(program)):
                command = found  # the first `program` command, else the first python command
            continue
        if words[0].startswith("--"):
            loose.extend(words)
    if command is not None:
        launcher, _, rest = command
        return Script(flags=rest, launcher=launcher, variables=variables, where=where)
    if not loose:
        raise SpecError(where, f"found no `{program}` command and no --flags")
    return Script(flags=loose, launcher=[], variables=variables, where=where)


def launch_world(script: Script) -> tuple[int | None, int | None, list[str]]:
    """(world size, GPUs per node, what was not literal) from torchrun's --nnodes/--nproc-per-node (emitters.md 4.3)
    or a WORLD_SIZE assignment; a value that is not a literal count counts as not given."""
    opts: dict[str, str] = {}
    tokens = script.launcher
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        key = name.replace("_", "-")
        if key in ("--nnodes", "--nproc-per-node"):
            if not eq:
                value = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
            opts[key] = value
        elif key == "--standalone":
            opts.setdefault("--nnodes", "1")
        i += 1
    counts: dict[str, int] = {}
    unresolved: list[str] = []
    for key, value in opts.items():
        if value.isdigit() and int(value) >= 1:
            counts[key] = int(value)
        else:
            unresolved.append(f"torchrun {key} {value!r}")
    gpn = counts.get("--nproc-per-node")
    if "--nnodes" in counts and gpn is not None:
        return counts["--nnodes"] * gpn, gpn, unresolved
    ws = script.variables.get("WORLD_SIZE")
    if ws is not None:
        if ws.isdigit() and int(ws) >= 1:
            return int(ws), gpn, unresolved
        unresolved.append(f"WORLD_SIZE={ws!r}")
    return None, gpn, unresolved
