"""Config checks of the diffusion kinds' checkpoint families (:data:`dlmrl.models.families.FAMILIES`), read from a
local checkpoint's ``config.json`` as JSON (no model code runs): an explicit ``model.family`` that contradicts it, a
checkpoint that ships its own code without ``model.trust_remote_code``, a block cache the family lacks."""

from __future__ import annotations

from pathlib import Path

from dlmrl.errors import ConfigError
from dlmrl.kinds.base import check_key

__all__ = ["CODE_SHIPPING_FAMILIES", "check_cache_family", "check_family_matches", "check_remote_code",
           "local_families"]

#: Families whose checkpoints always ship their own model code (``auto_map``): loading runs it.
CODE_SHIPPING_FAMILIES = ("llada", "dream", "sdar", "llada2", "nemotron_diffusion", "llada_moe", "fast_dllm_v2")


def local_families(name_or_path: str) -> list[str] | None:
    """The registered families whose ``detect`` accepts a local checkpoint's ``config.json`` (read as JSON, no code
    runs); ``None`` for a hub id or a folder without one."""
    from dlmrl.models.families import FAMILIES
    from dlmrl.models.loading import read_checkpoint_config, resolve_model_path

    path = Path(resolve_model_path(name_or_path))
    if not (path / "config.json").is_file():
        return None
    config = read_checkpoint_config(str(path))
    return [name for name in FAMILIES.names() if FAMILIES.get(name).detect(config)]


def check_family_matches(name_or_path: str, family: str) -> None:
    """An explicit ``model.family`` must not contradict a local checkpoint's ``config.json`` (read as JSON, no code
    runs): a config that one other family recognises, and this one does not, would load with the wrong adapter and
    fail inside it (or, worse, run). Hub ids and configs no family or several recognise are left to the load.

    Raises:
        ConfigError: naming ``model.family``.
    """
    found = local_families(name_or_path)
    if found is None:
        return
    check_key(len(found) != 1 or found[0] == family, "model.family",
              f"{family!r} does not match {name_or_path!r}, whose config.json is a {found[0] if found else ''!r} "
              f"checkpoint; use model.family auto (or {found[0] if found else ''!r})")


def check_remote_code(m) -> None:
    """``model.trust_remote_code`` (of the ``model`` section ``m``) must be on for a checkpoint that ships its own
    model code: a family whose checkpoints all do, or a local folder whose ``config.json`` says so (read as JSON, no
    code runs). A hub id of an undetected family is checked when it loads.

    Raises:
        ConfigError: naming ``model.trust_remote_code``.
    """
    if m.trust_remote_code:
        return
    why = None
    if m.family in CODE_SHIPPING_FAMILIES:
        why = f"model.family {m.family!r} checkpoints ship their own model code"
    else:
        from dlmrl.models.loading import needs_remote_code, read_checkpoint_config, resolve_model_path

        path = Path(resolve_model_path(m.name_or_path))
        if (path / "config.json").is_file() and needs_remote_code(read_checkpoint_config(str(path))):
            why = f"{m.name_or_path!r} ships its own model code (config.json auto_map)"
    check_key(why is None, "model.trust_remote_code",
              f"{why}, and loading it runs that code: set model.trust_remote_code=true if you trust its source")


def check_cache_family(family: str | None, mode: str, model: str | None = None, loaded=None) -> None:
    """Refuse ``sampling.cache = mode`` for a model family without a block cache (validation, when the family is
    named; the trainer, once ``family: auto`` has been detected at load), and, given the ``loaded`` model, one its
    family's cache cannot serve (the cache function's ``check(model)``, e.g. an LLaDA configuration with ALiBi:
    :func:`dlmrl.models.llada_cache.check_llada_cache`), before any pass runs.

    Raises:
        ConfigError: naming ``sampling.cache``, the model when given, the family and why.
    """
    from dlmrl.models.families import cached_logits_of

    where = f" with model {model!r}" if model else ""
    try:
        fn = cached_logits_of(family, mode)
        check = getattr(fn, "check", None)
        if loaded is not None and check is not None:
            check(loaded)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config key 'sampling.cache'{where}: {err}") from None
