"""The configuration machinery: frozen dataclasses with documented fields (``doc``), loaded
from YAML (safe loader) with type-checked command-line overrides (``--set train.optim.lr=1e-3``).

An unknown key or a value of the wrong type is a :class:`ConfigError` that names the key
(``optim.lr``), what was given and what is expected. Field documentation lives where the
field is declared (``doc(...)``) and is printed by ``hvd-bert config --explain``. A section
may define ``check_against(base, key)``: :func:`load_config` calls it to refuse a setting that
does not apply (``optim.eta`` with LAMB); a job's config may define ``resolve_given(keys)``: it
gets the keys the recipe and ``--set`` gave, so that a setting the user gave wins over a job
default and two that conflict are refused.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from dataclasses import field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

__all__ = ["ConfigError", "doc", "require", "from_dict", "to_dict", "load_config", "apply_overrides",
           "overlay", "check_applicable", "explain",
           "given_keys"]

INT_RANGE = (-2**63, 2**63 - 1)  # every integer setting: what a 64-bit signed integer holds
# the jobs a recipe's ``job:`` may name: config.jobs' classes' JOB (tests/core/test_config.py checks)
RECIPE_JOBS = ("finetune", "ncf", "predict", "pretrain")


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


def doc(default: Any, text: str, **kw) -> Any:
    """A dataclass field with a default and its documentation."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples for sequence defaults (configs are frozen)")
    return field(default=default, metadata={"doc": text}, **kw)


# ----------------------------------------------------------------------------- type checks
def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        kinds = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(kinds) == 1 and value is not None:  # (an optional setting: the one kind's own reason)
            raise errors[[a for a in typing.get_args(tp)].index(kinds[0])]
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {shown(value)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {shown(value)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) is type(allowed[allowed.index(value)]):
            return value
        raise ConfigError(f"{key}: expected one of {', '.join(map(repr, allowed))}, got {shown(value)}")
    if origin is tuple:
        (item_tp, *rest) = typing.get_args(tp)
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list of {_type_name(item_tp)}, got {shown(value)}")
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {shown(value)}")
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise ConfigError(f"{key}: {shown(value)} is outside the 64-bit integers every integer "
                                  f"setting holds ({INT_RANGE[0]} to {INT_RANGE[1]}); give a smaller number")
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{key}: must be a finite number, got {shown(value)}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
        if value is None:  # (``--set key=`` reads as null: an empty text is written key='')
            raise ConfigError(f"{key}: expected text, got nothing; for an empty value write {key}=''")
    else:
        raise TypeError(f"{key}: unsupported annotation {tp!r} in a config class")
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {shown(value)} ({type(value).__name__})")


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _nested_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of config class ``cls`` (``optim.lr``, ``batch.local_batch_size``, ...)."""
    out = []
    for f, tp in ((f, _hints(cls).get(f.name)) for f in fields(cls)):
        out.append(prefix + f.name)
        if isinstance(tp, type) and is_dataclass(tp):
            out += _nested_keys(tp, f"{prefix}{f.name}.")
    return out


def _unknown(key: str, name: str, cls) -> ConfigError:
    names = [f.name for f in fields(cls)]
    close = difflib.get_close_matches(name, names, n=1)
    deeper = [k for k in _nested_keys(cls) if k.rsplit(".", 1)[-1] == name]  # (train.lr: train.optim.lr)
    section = key[:-len(name)] if key.endswith(name) else ""
    hint = (f" (did you mean {(section + deeper[0])!r}?)" if deeper else
            f" (did you mean {close[0]!r}?)" if close else "")
    return ConfigError(f"unknown key {key!r}{hint}; {cls.__name__} has: {', '.join(names)}")


def from_dict(cls, data: Mapping[str, Any], prefix: str = ""):
    """Build config class ``cls`` from a mapping, checking every key and type."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or cls.__name__}: expected a mapping, got {shown(data)}")
    hints = _hints(cls)
    names = {f.name for f in fields(cls)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            raise _unknown(key, str(name), cls)
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def to_dict(cfg) -> dict:
    """Plain dict (lists for tuples) of a config, for YAML/JSON dumps and checkpoints."""
    def conv(v):
        if is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


# A recipe or --set value is a few hundred nodes; a nest of YAML aliases ("billion laughs")
# expands 200 bytes into billions. Their expanded size is counted on the composed node graph
# (each node once) before anything is built, and refused past this.
MAX_YAML_NODES = 100_000


def shown(value: Any) -> str:
    """``repr(value)`` bounded in depth and length, for an error line: a value built from
    aliases can be shared a billion times over and must never be expanded to be printed."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxtuple, r.maxset = 2, 80, 80, 4, 4, 4, 4
    text = r.repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def safe_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)`` with aliases bounded: a document whose expanded size passes
    ``MAX_YAML_NODES`` or that refers to itself is a ConfigError naming ``source``."""
    import yaml  # PyYAML, imported only where configs are parsed
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _expanded_size(node, source)
            _refuse_ambiguous(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {_first_line(e)}") from None
    except RecursionError:
        raise ConfigError(f"{source} nests its values deeper than YAML can be read here; a recipe is a few "
                          f"levels of settings: write it out flat") from None


def _refuse_ambiguous(root, source: str) -> None:
    """A key written twice in one mapping (YAML keeps the last silently: a whole block dropped) and
    a base-60 number (YAML 1.1 reads ``1:30`` as 90) are ConfigErrors naming the line."""
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in keys:
                        raise ConfigError(f"{source} line {k.start_mark.line + 1}: the key {k.value!r} is "
                                          f"written twice in one mapping (also line {keys[k.value] + 1}); "
                                          f"YAML would keep only the last: write each key once")
                    keys[k.value] = k.start_mark.line
                stack += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
        elif isinstance(node, yaml.ScalarNode) and node.tag.endswith((":int", ":float")) \
                and ":" in node.value:
            raise ConfigError(f"{source} line {node.start_mark.line + 1}: {node.value} reads as a base-60 "
                              f"number in YAML 1.1; quote it if it is text, or write the number in base 10")


def _first_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:300] + "..."


def _expanded_size(root, source: str) -> int:
    """Nodes of ``root`` as a tree (an alias counts its whole target each time), each node
    visited once; a ConfigError past ``MAX_YAML_NODES`` or on a node inside itself."""
    import yaml

    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            children = _children(node)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_NODES:
                if len(sizes) >= sizes[key]:  # (as many nodes written as counted: no alias in it)
                    raise ConfigError(f"{source} holds more than {MAX_YAML_NODES:,} YAML values, where a "
                                      f"recipe has a few hundred: give a recipe of settings, not data")
                raise ConfigError(f"{source} expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases of "
                                  f"aliases): write the values out instead of nesting aliases")
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ConfigError(f"{source} holds a YAML alias inside its own anchor (a recursive value); "
                              f"write the value out")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if not isinstance(c, yaml.ScalarNode) or
                     id(c) not in sizes)
    return sizes[id(root)]


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _parse_scalar(text: str) -> Any:
    return safe_yaml(text, f"the --set value {shown(text)}")


def apply_overrides(cfg, overrides: Sequence[str]):
    """Apply ``key.path=value`` overrides (value in YAML syntax) with type checks."""
    section = getattr(type(cfg), "JOB_SECTION", None)  # a job's section: its keys as the job names them
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value (e.g. train.optim.lr=1e-3)")
        path, text = item.split("=", 1)
        path = path.strip()
        key = path[len(section) + 1:] if section and path.startswith(section + ".") else path
        try:
            cfg = _set_path(cfg, key.split("."), _parse_scalar(text), path)
        except ConfigError as e:
            raise ConfigError(f"{e}{_elsewhere(cfg, key)}") from None
    return cfg


def _elsewhere(cfg, path: str) -> str:
    """Where an unknown key lives in this config, when it is a key of one of its sections (a
    job's ``train.optim.lr`` given as ``optim.lr``, as the engine's own config names it)."""
    if not str(path) or _has(cfg, path.split(".")):
        return ""
    for f in fields(cfg):
        sub = getattr(cfg, f.name)
        if is_dataclass(sub) and _has(sub, path.split(".")):
            return f"; this job's key is {f.name}.{path}"
    return ""


def _has(cfg, parts: list[str]) -> bool:
    for name in parts:
        if not is_dataclass(cfg) or name not in {f.name for f in fields(cfg)}:
            return False
        cfg = getattr(cfg, name)
    return True


def _set_path(cfg, parts: list[str], value: Any, full: str):
    name = parts[0]
    if not is_dataclass(cfg):
        raise ConfigError(f"{full}: {name!r} is not a section")
    if name not in {f.name for f in fields(cfg)}:
        raise _unknown(full, name, type(cfg))
    if len(parts) == 1:
        new = _coerce(value, _hints(type(cfg))[name], full)
    else:
        new = _set_path(getattr(cfg, name), parts[1:], value, full)
    try:
        return replace(cfg, **{name: new})
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{full}: {e}") from None


def load_config(cls, path: str | Path | None = None, overrides: Sequence[str] = ()):
    """Load ``cls`` from a YAML file (missing keys take their defaults), then apply overrides."""
    data: Mapping = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} {'is a folder' if p.is_dir() else 'does not exist'}; pass an "
                              f"existing YAML file (e.g. one of recipes/*.yaml)")
        try:  # (a file that is not UTF-8: named, not a decoder's bare message)
            data = safe_yaml(p.read_text(encoding="utf-8"), f"config file {p}") or {}
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {p} is not UTF-8 text ({e}); save it as UTF-8") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = _for_job(cls, dict(data), p)
    section = getattr(cls, "JOB_SECTION", None)
    if section and isinstance(data.get(section), Mapping):  # a job recipe: its section of cls's settings
        data = data[section]
    base = cls()
    cfg = apply_overrides(overlay(base, data), overrides)
    check_applicable(cfg, base, f"{section}." if section else "")
    resolve = getattr(cfg, "resolve_given", None)  # a job's settings that depend on what the user gave
    if resolve is not None:
        given = {o.split("=", 1)[0].strip() for o in overrides}
        if section:
            given = {k[len(section) + 1:] if k.startswith(section + ".") else k for k in given}
        cfg = resolve(given_keys(data) | given)
    return cfg


def _for_job(cls, data: dict, path: Path) -> dict:
    """A recipe less its ``job:`` key, refused (one line naming both jobs) when it names another
    job than ``cls``'s (``cls.JOB``; the engine's own TrainConfig reads any job's ``train:``)."""
    job = data.pop("job", None)
    mine = getattr(cls, "JOB", None)
    names = RECIPE_JOBS
    if job is not None and (not isinstance(job, str) or job not in names):
        close = difflib.get_close_matches(job, names, n=1) if isinstance(job, str) else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"config file {path}: job {shown(job)} is not one of hvd-bert's jobs{hint}; write "
                          f"job: as one of {', '.join(names)}, or leave it out")
    if job and mine and job != mine:
        raise ConfigError(f"config file {path} is a recipe for hvd-bert {job}, not {mine}: run it with "
                          f"hvd-bert {job} --config {path}, or give {mine} one of its own recipes")
    return data


def given_keys(data: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys a recipe sets (``train.optim.lr``), sections included."""
    out = set()
    for name, value in data.items():
        key = f"{prefix}{name}"
        out.add(key)
        if isinstance(value, Mapping):
            out |= given_keys(value, key + ".")
    return out


def overlay(cfg, data: Mapping[str, Any], prefix: str = ""):
    """``cfg`` with the keys of ``data`` (a recipe) replaced, and nothing else: a recipe that
    names ``train.seed`` changes the seed and keeps every other setting of ``cfg`` (the job's
    defaults), as ``--set train.seed=...`` does."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or type(cfg).__name__}: expected a mapping, got {shown(data)}")
    hints = _hints(type(cfg))
    names = {f.name for f in fields(cfg)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            raise _unknown(key, str(name), type(cfg))
        current = getattr(cfg, name)
        if is_dataclass(current) and isinstance(value, Mapping):
            kwargs[name] = overlay(current, value, key)
        else:
            kwargs[name] = _coerce(value, hints[name], key)
    try:
        return replace(cfg, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or type(cfg).__name__}: {e}") from None


def check_applicable(cfg, base, prefix: str = "") -> None:
    """Every section that defines ``check_against(base, key)`` checks its changed settings
    against ``base`` (the job's defaults), nested sections included."""
    for f in fields(cfg):
        v, b = getattr(cfg, f.name), getattr(base, f.name)
        key = f"{prefix}{f.name}"
        if hasattr(v, "check_against"):
            v.check_against(b, key)
        if is_dataclass(v):
            check_applicable(v, b, key + ".")


def explain(cls, prefix: str = "", instance=None) -> list[str]:
    """Lines ``key (type, default): doc`` for every field, nested sections included, with the
    defaults of ``instance`` (a job's config: ``cls()``) rather than of the section classes."""
    instance = cls() if instance is None else instance
    out = []
    hints = _hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if is_dataclass(tp):
            out += explain(tp, key + ".", getattr(instance, f.name))
            continue
        default = getattr(instance, f.name)
        if isinstance(default, tuple):
            default = list(default)
        out.append(f"{key} ({_type_name(tp)}, default {default!r}): {f.metadata.get('doc', '')}")
    return out


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)
