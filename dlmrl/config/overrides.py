"""Reading configs: YAML files and ``key=value`` overrides onto the schema's dataclasses.

Overrides use dotted keys (``train.learning_rate=1e-5``) or, when a leaf name is unique across
sections, the bare leaf (``learning_rate=1e-5``). Values are parsed with YAML rules and checked
against the field's type; an unknown key or bad value raises ``ConfigError`` naming the key (and the
file and line for YAML input).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from dlmrl.config.schema import iter_fields
from dlmrl.errors import ConfigError

#: section names accepted for another: ``sampler.threshold`` is ``sampling.threshold``
_SECTION_ALIASES = {"sampler": "sampling"}


def _unalias(key: str) -> str:
    """``key`` with an aliased section name replaced (``sampler.cache`` -> ``sampling.cache``)."""
    head, dot, rest = key.partition(".")
    return f"{_SECTION_ALIASES[head]}.{rest}" if dot and head in _SECTION_ALIASES else key


def _options_fields(cls: type) -> list[str]:
    """The dotted keys of ``cls``'s options mappings (``dict`` fields such as ``estimator.options``): a part's own
    settings, whose names only the part knows (checked when the part is built, :func:`part_options`)."""
    return [k for k, _, t in iter_fields(cls) if t is dict or typing.get_origin(t) is dict]


def _in_options(cls: type, key: str) -> bool:
    return any(key.startswith(k + ".") for k in _options_fields(cls))


def _resolve_key(cls: type, key: str) -> str:
    keys = [k for k, _, _ in iter_fields(cls)]
    if _unalias(key) in keys or _in_options(cls, _unalias(key)):
        key = _unalias(key)
    if key in keys or _in_options(cls, key):
        return key
    leaf = [k for k in keys if k.rsplit(".", 1)[-1] == key]
    if len(leaf) == 1:
        return leaf[0]
    if len(leaf) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous; use one of {leaf}")
    import difflib

    # section names too: a misspelt section ("trian:") should point at "train", not at a leaf that looks alike
    sections = sorted({k.split(".", 1)[0] for k in keys if "." in k})
    close = difflib.get_close_matches(key, sections + keys + [k.rsplit('.', 1)[-1] for k in keys], n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown config key {key!r}.{hint} (see --help for every key)")


def _coerce(key: str, ftype: Any, value: Any, where: str = "") -> Any:
    origin = typing.get_origin(ftype)
    args = typing.get_args(ftype)
    if ftype is dict or origin is dict:  # (an options mapping: its values are checked by the part it configures)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}config key {key!r} expects a mapping of settings, got {value!r}")
        return {str(k): v for k, v in value.items()}
    if ftype is typing.Any:
        return value
    if origin is list:  # (a comma list from the command line, a YAML list, or one bare value)
        if value is None:
            return []
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(f"{key}[{i}]", args[0], v, where) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        ftype = next(a for a in args if a is not type(None))
    if ftype in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "3e-5" as a string; accept any number Python can parse.
        try:
            value = int(value) if ftype is int else float(value)
        except ValueError:
            pass
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }.get(ftype, lambda v: True)(value)  # (other types: the part that reads the value checks it)
    if not ok:
        raise ConfigError(f"{where}config key {key!r} expects {ftype.__name__}, got {value!r}")
    if ftype is float and not math.isfinite(value):
        raise ConfigError(f"{where}config key {key!r} must be a finite number, got {value!r}")
    return float(value) if ftype is float else value


#: attribute of a config object holding the dotted keys the user chose (:func:`user_keys`)
_USER_KEYS = "_dlmrl_user_keys"


def user_keys(cfg: Any) -> frozenset[str] | None:
    """The dotted keys the user chose: set by an override, a mapping (the Python API's ``config`` dict) or a YAML
    file of theirs, not by the packaged default recipe or a run's saved config (:func:`load_yaml`'s ``chosen``);
    ``None`` for a config built in Python (no key applied)."""
    keys = getattr(cfg, _USER_KEYS, None)
    return frozenset(keys) if keys is not None else None


def _note_set(cfg: Any, key: str, chosen: bool = True) -> None:
    user = cfg.__dict__.setdefault(_USER_KEYS, set())
    if chosen:
        user.add(key)


def _set(obj: Any, dotted: str, value: Any) -> None:
    *path, leaf = dotted.split(".")
    for p in path:
        obj = obj.setdefault(p, {}) if isinstance(obj, dict) else getattr(obj, p)
    if isinstance(obj, dict):
        obj[leaf] = value
    else:
        setattr(obj, leaf, value)


def _field_type(fields: dict, key: str) -> Any:
    """The type ``key`` must have: its field's, or ``Any`` inside an options mapping (the part checks it)."""
    return fields.get(key, typing.Any)


def apply_mapping(cfg: Any, mapping: dict, where: str = "", prefix: str = "", chosen: bool = True,
                  errors: list[ConfigError] | None = None) -> None:
    """Apply a nested mapping (from YAML) to ``cfg``; unknown keys raise ``ConfigError``. ``chosen``: the keys
    count as the user's (:func:`user_keys`). ``errors``: a list that collects each bad key's ``ConfigError`` while
    the others are applied (:func:`load_yaml` reports every bad value of a file at once); ``None``: raise the
    first."""
    fields = {k: t for k, _, t in iter_fields(type(cfg))}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        is_section = any(f.startswith(key + ".") for f in fields)
        if is_section and (v is None or isinstance(v, dict)):
            apply_mapping(cfg, v or {}, where, prefix=key + ".", chosen=chosen, errors=errors)
            continue
        try:
            if key not in fields:
                if is_section:
                    raise ConfigError(f"{where}config key {key!r} is a section; give it a mapping of settings")
                key = _resolve_key(type(cfg), key)  # a unique bare leaf name, or raises with a suggestion
            value = _coerce(key, _field_type(fields, key), v, where)
        except ConfigError as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        if key in _options_fields(type(cfg)):  # (a YAML mapping adds to the options set before it)
            value = {**_get(cfg, key), **value}
        _set(cfg, key, value)
        _note_set(cfg, key, chosen)


def _get(obj: Any, dotted: str) -> Any:
    for p in dotted.split("."):
        obj = obj[p] if isinstance(obj, dict) else getattr(obj, p)
    return obj


def mapping_keys(cls: type, mapping: dict) -> set[str]:
    """The dotted keys of ``cls`` that a mapping (as :func:`apply_mapping` takes it: nested sections, dotted keys,
    unique bare leaf names) sets; an empty section sets none.

    Raises:
        ConfigError: an unknown or ambiguous key.
    """
    sections = {k.rsplit(".", 1)[0] for k, _, _ in iter_fields(cls) if "." in k}
    return {_resolve_key(cls, k) for k, v in flatten(mapping) if not (v is None and k in sections)}


def _yaml_line(path: Path, dotted: str) -> str:
    """``"<file> line N: "`` for the line that sets ``dotted`` (section-aware), else ``"<file>: "``."""
    line = _yaml_line_number(path, dotted)
    return f"{path} line {line}: " if line is not None else f"{path}: "


def _yaml_line_number(path: Path, dotted: str) -> int | None:
    """The line of ``path`` that sets ``dotted``: its leaf under its section, the bare leaf or the whole dotted key
    at the top level; ``None`` when no line does."""
    whole = dotted.split("[", 1)[0]  # (a list entry, key[i], is set on its key's line)
    *sections, leaf = whole.split(".")
    section = sections[0] if sections else None
    current = None
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.strip()[:-1]
        stripped = line.strip()
        top = bool(line) and not line[0].isspace()
        if stripped.startswith(f"{leaf}:") and (current == section if not top else section is None or top):
            return i
        if top and "." in whole and stripped.startswith(f"{whole}:"):
            return i
    return None


def _yaml_error_place(e: yaml.YAMLError) -> str:
    """`` line N, column M`` of a YAML parse error (1-based), or ``""``."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    """The parse error in one line, with the likely cause for the indentation errors YAML reports cryptically."""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    context = getattr(e, "context", None)
    text = f"{problem} ({' '.join(context.split())})" if context else problem
    if "block end" in text or "mapping values are not allowed" in text or "could not find expected ':'" in text:
        text += "; check the indentation of this line against the lines above (every key of a section indented the " \
                "same, with spaces)"
    if "\\t" in problem or "tab" in problem:
        text += "; YAML does not allow tabs for indentation"
    return text


def _key_in(message: str) -> str:
    return message.split("'")[1] if "'" in message else ""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (YAML's default keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(cfg: Any, path: str | Path, chosen: bool | None = None) -> None:
    """Update ``cfg`` from a YAML file; errors name the file and (when found) the line, every bad value of the file
    in one ``ConfigError``, one line each (unknown keys, values of the wrong type).

    Args:
        chosen: whether the file's keys are the user's choices (:func:`user_keys`); ``None``: unless the file is
            the packaged default recipe (a run's saved ``config.yaml``, a full dump, is passed ``False``).
    """
    path = Path(path)
    if chosen is None:
        from dlmrl.config.schema import default_config_path

        chosen = path.resolve() != Path(default_config_path()).resolve()
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file (a folder?)")
    from dlmrl.data.text_files import utf16_problem

    try:
        utf16 = utf16_problem(path.read_bytes())
        if utf16 is not None:
            raise ConfigError(f"{path}: UTF-16 text ({utf16}); config files are read as UTF-8: save it as UTF-8 (e.g. "
                              "iconv -f utf-16 -t utf-8 IN > OUT)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{_yaml_error_place(e)}: invalid YAML: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    errors: list[ConfigError] = []
    apply_mapping(cfg, data, chosen=chosen, errors=errors)
    located = [f"{_yaml_line(path, _key_in(str(e)))}{e}" for e in errors]
    if len(located) == 1:
        raise ConfigError(located[0])
    if located:  # (every bad value of the file at once, one per line: not a fix-and-rerun round per value)
        raise ConfigError(f"{path}: {len(located)} bad values, one per line:\n" + "\n".join(f"  {x}" for x in located))


def locate_error(error: ConfigError, path: str | Path | None, overrides: list[str] = ()) -> ConfigError:
    """Prefix a validation error with where its key was set: the command-line override that set it (overrides win
    over the file), else the YAML file and line, when there is one. A ``config key '...'`` error whose key neither
    sets keeps its value from the default: it says so, and the file is not blamed."""
    if path is not None and str(error).startswith(str(path)):  # (the file's own error, raised as it loaded)
        return error
    key = _key_in(str(error))
    if key:
        whole = key.split("[", 1)[0]  # (a list entry, key[i], is set by its key)
        for o in overrides:
            name = _unalias(o.split("=", 1)[0].strip())
            # the key itself, a bare leaf of it, or (an options mapping) a setting inside it or the mapping above it
            if name and (name == whole or whole.endswith("." + name) or name.endswith("." + whole)
                         or name.startswith(whole + ".") or whole.startswith(name + ".")):
                return ConfigError(f"command-line override {o!r}: {error}")
    if path is None or str(error).startswith(str(path)) or not Path(path).is_file():
        return error
    try:
        line = _yaml_line_number(Path(path), key)
    except (OSError, UnicodeDecodeError):  # (load_yaml reported an unreadable file already)
        return error
    if line is not None:
        return ConfigError(f"{path} line {line}: {error}")
    if str(error).startswith("config key "):  # (a key the file does not set: its value is the default)
        return ConfigError(f"{error} (the default value: {path} does not set {key.split('[', 1)[0]})")
    return ConfigError(f"{path}: {error}")


def apply_overrides(cfg: Any, overrides: list[str]) -> None:
    """Apply ``key=value`` strings (value parsed as YAML) to ``cfg``."""
    fields = {k: t for k, _, t in iter_fields(type(cfg))}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        raw_key, raw = item.split("=", 1)
        key = _resolve_key(type(cfg), raw_key.strip())
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        ftype = _field_type(fields, key)
        optional = typing.get_origin(ftype) in (typing.Union, types.UnionType)
        if ftype is str or (optional and str in typing.get_args(ftype)):
            value = raw if value is not None and not isinstance(value, str) else value
        _set(cfg, key, _coerce(key, ftype, value))
        _note_set(cfg, key)


def part_options(cls: type, options: dict, key: str, exclude: tuple[str, ...] = ()) -> dict:
    """``options`` (an options mapping such as ``estimator.options``) checked against the dataclass ``cls``
    whose settings they are, each value coerced to its field's type: the keyword arguments ``cls(**...)`` takes.

    Args:
        cls: a dataclass (an estimator class, a task's options class).
        options: name -> value as the YAML or an override gave it.
        key: the mapping's dotted config key (``"estimator.options"``), for the error.
        exclude: fields that are not settings (filled by the caller).
    Raises:
        ConfigError: a name that is not a field of ``cls`` (with a did-you-mean), or a value of the wrong type,
            naming ``<key>.<name>``.
    """
    import difflib

    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in exclude]
    out = {}
    for name, value in options.items():
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"config key {key + '.' + name!r}: {cls.__name__} has no setting {name!r}.{hint} "
                              f"(its settings: {', '.join(names) or 'none'})")
        ftype = hints[name]
        simple = ftype in (bool, int, float, str) or typing.get_origin(ftype) in (list, typing.Union, types.UnionType)
        out[name] = _coerce(f"{key}.{name}", ftype, value) if simple else value
    return out


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def flatten(d: dict, prefix: str = ""):
    """``(dotted key, value)`` pairs of a nested dict (``{"train": {"seed": 0}}`` → ``("train.seed", 0)``)."""
    for k, v in d.items():
        yield from flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
