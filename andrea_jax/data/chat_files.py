"""Where a chat template is read from: a tokenizer folder, a template file, or the Hub.

:func:`load_chat_template` accepts what ``transformers`` writes and reads:

* a tokenizer folder as ``transformers`` 5 saves it (``chat_template.jinja``, named templates in
  ``additional_chat_templates/<name>.jinja``, the special tokens in ``tokenizer_config.json`` and
  the added tokens in ``tokenizer.json``) or as version 4 did (``chat_template`` inside
  ``tokenizer_config.json``), and a processor's ``chat_template.json``; the separate files take
  precedence over the configuration's entry, as ``transformers`` reads them;
* that folder's ``tokenizer_config.json``;
* a ``.jinja`` or ``.json`` template file, the special tokens taken from the
  ``tokenizer_config.json`` beside it;
* ``hf:<repo>[@revision]``, the same files of a Hub model, cached (:mod:`andrea_jax.data.hfhub`:
  it fails at once offline, as tokenizers do).

The special tokens a template reads (``bos_token``, ``eos_token``, ...) come from the tokenizer's
configuration, as ``apply_chat_template`` passes them; a template that reads one with no
configuration beside it is refused (Jinja would render it as nothing, silently).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from andrea_jax.data.chat_templates import (CHATML, PLAIN, TEMPLATE_TOKENS, ChatTemplate,
                                            template_variables)
from andrea_jax.data.errors import DataError

CONFIG_FILE = "tokenizer_config.json"
# A tokenizer folder's files that say something about its chat templates (transformers 4 and 5).
_FOLDER_FILES = (CONFIG_FILE, "chat_template.jinja", "chat_template.json", "tokenizer.json",
                 "special_tokens_map.json")
EXTRA_TEMPLATES = "additional_chat_templates"


def _token_text(value: Any) -> str | None:
  """A special token as tokenizer_config.json stores it: a string or ``{"content": ...}``."""
  if isinstance(value, Mapping):
    value = value.get("content")
  return value if isinstance(value, str) else None


def _named_templates(raw: Any) -> dict[str, str]:
  """``name -> template`` of a ``chat_template`` entry: one string (``"default"``), a list of
  ``{"name", "template"}`` (as saved) or a mapping (as held in memory)."""
  if isinstance(raw, str):
    return {"default": raw} if raw else {}
  if isinstance(raw, Mapping):
    return {k: v for k, v in raw.items() if isinstance(v, str)}
  if isinstance(raw, list):
    return {t.get("name"): t.get("template") for t in raw
            if isinstance(t, Mapping) and isinstance(t.get("template"), str)}
  return {}


def template_from_config(config: Mapping[str, Any], where: str = CONFIG_FILE,
                         name: str = "", *, templates: Mapping[str, str] | None = None,
                         added_tokens: Sequence[str] = ()) -> ChatTemplate:
  """The :class:`ChatTemplate` of a parsed ``tokenizer_config.json``.

  ``templates`` (``name -> Jinja``, the template files of the config's folder) take precedence
  over the config's own ``chat_template``, which is a string or a list of ``{"name",
  "template"}``. ``name`` is taken (``""``: ``"default"``); without a name a
  ``tool_use`` template becomes :attr:`ChatTemplate.tool_source`, as ``transformers`` picks it for
  a conversation with tools. The markers are the added tokens (``added_tokens``, and those of the
  config's ``added_tokens_decoder``) whose text appears in the template, plus the special tokens
  the template names (``eos_token`` ...), whitespace-only tokens left out, as ``transformers``
  finds a template's control tokens.

  Example:
    >>> template_from_config({"chat_template": "{{ eos_token }}", "eos_token": "</s>"}).tokens
    (('eos_token', '</s>'),)
  """
  found = {**_named_templates(config.get("chat_template")), **(templates or {})}
  if not found:
    raise DataError(f"{where}: no chat_template (a Jinja string) in the tokenizer configuration, "
                    "nor a chat_template.jinja beside it")
  key = name or "default"
  if key not in found:
    raise DataError(f"{where}: no chat template named {key!r} (has {sorted(found)})")
  raw = found[key]
  tool = "" if name else found.get("tool_use", "")   # transformers: a named template is kept
  tokens = tuple((k, t) for k in TEMPLATE_TOKENS if (t := _token_text(config.get(k))) is not None)
  added = [_token_text(v) for v in (config.get("added_tokens_decoder") or {}).values()]
  added += list(added_tokens)
  text = raw + "\0" + tool
  markers = {t for t in added if t and t.strip() and t in text}
  markers |= {t for k, t in tokens if k in text and t.strip()}
  return ChatTemplate(f"jinja:{where}", raw, tokens, tuple(sorted(markers)), tool)


def _read_json(path: str | None, spec: str) -> dict[str, Any]:
  if path is None:
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except ValueError as e:
    raise DataError(f"chat template {spec!r}: {path} is not JSON ({e})") from e
  if not isinstance(value, dict):
    raise DataError(f"chat template {spec!r}: {path} holds a {type(value).__name__}, not a JSON "
                    "object")
  return value


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _folder_files(folder: str) -> dict[str, Any]:
  """The template-related files of a tokenizer folder: ``file name -> path`` (those present), and
  ``"extra" -> {name: path}`` for ``additional_chat_templates/<name>.jinja``."""
  files: dict[str, Any] = {f: os.path.join(folder, f) for f in _FOLDER_FILES
                           if os.path.isfile(os.path.join(folder, f))}
  extra = os.path.join(folder, EXTRA_TEMPLATES)
  files["extra"] = ({f.removesuffix(".jinja"): os.path.join(extra, f)
                     for f in sorted(os.listdir(extra)) if f.endswith(".jinja")}
                    if os.path.isdir(extra) else {})
  return files


def _hub_files(repo_spec: str, name: str, spec: str) -> dict[str, Any]:
  """The same files of a Hub repository, each fetched (and cached) when the repository has it."""
  from andrea_jax.data import hfhub
  repo, revision = hfhub.split_name(repo_spec)
  if not repo:
    raise DataError(f"chat template {spec!r}: no repository after 'hf:'")
  kw = dict(revision=revision, what=f"chat template {spec!r}",
            local_hint="Point the template at a local tokenizer folder or template file.")
  files: dict[str, Any] = {"extra": {}}
  try:
    files[CONFIG_FILE] = hfhub.hub_file(repo, CONFIG_FILE, **kw)
  except hfhub.NotOnHub:
    pass
  wanted = ["chat_template.jinja", f"{EXTRA_TEMPLATES}/{name or 'tool_use'}.jinja"]
  if "added_tokens_decoder" not in _read_json(files.get(CONFIG_FILE), spec):
    wanted.append("tokenizer.json")   # transformers 5 keeps the added tokens there only
  for f in wanted:
    path = hfhub.optional_hub_file(repo, f, **kw)
    if path is not None and f.startswith(EXTRA_TEMPLATES):
      files["extra"][os.path.basename(f).removesuffix(".jinja")] = path
    elif path is not None:
      files[f] = path
  if CONFIG_FILE not in files and "chat_template.jinja" not in files:
    raise DataError(f"chat template {spec!r}: {repo} has neither {CONFIG_FILE} nor "
                    f"chat_template.jinja{' in the local cache (offline)' if hfhub.offline() else ''}")
  return files


def _added_tokens(files: Mapping[str, Any], spec: str) -> list[str]:
  """The added tokens of a folder's ``tokenizer.json`` (where transformers 5 keeps them)."""
  tokens = _read_json(files.get("tokenizer.json"), spec).get("added_tokens") or []
  return [t["content"] for t in tokens if isinstance(t, Mapping) and isinstance(t.get("content"),
                                                                                  str)]


def _from_files(files: Mapping[str, Any], name: str, spec: str, where: str) -> ChatTemplate:
  """The template of a tokenizer folder's files (local or from the Hub), named ``name``."""
  config = _tokens_config(files, spec)
  templates = _named_templates(_read_json(files.get("chat_template.json"), spec)
                               .get("chat_template"))
  if "chat_template.jinja" in files:
    templates["default"] = _read_text(files["chat_template.jinja"])
  templates.update({n: _read_text(p) for n, p in files.get("extra", {}).items()})
  origin = files.get("chat_template.jinja") or files.get("chat_template.json") or where
  template = template_from_config(config, origin, name, templates=templates,
                                  added_tokens=_added_tokens(files, spec))
  return _checked(template, spec, have_config=CONFIG_FILE in files or (
      "special_tokens_map.json" in files))


def _tokens_config(files: Mapping[str, Any], spec: str) -> dict[str, Any]:
  """The tokenizer configuration, its special tokens completed from a legacy
  ``special_tokens_map.json``."""
  config = _read_json(files.get(CONFIG_FILE), spec)
  legacy = _read_json(files.get("special_tokens_map.json"), spec)
  return {**{k: v for k, v in legacy.items() if k in TEMPLATE_TOKENS}, **config}


def _from_template_file(path: str, name: str, spec: str) -> ChatTemplate:
  """A ``.jinja`` file, or a ``.json`` file holding a ``chat_template`` (``chat_template.json``, a
  renamed configuration): the template, with the special tokens and added tokens of the
  tokenizer it sits beside (one folder up from ``additional_chat_templates/``)."""
  folder = os.path.dirname(os.path.abspath(path))
  home = os.path.dirname(folder) if os.path.basename(folder) == EXTRA_TEMPLATES else folder
  files = {k: v for k, v in _folder_files(home).items()
           if k in (CONFIG_FILE, "tokenizer.json", "special_tokens_map.json")}
  config = _tokens_config(files, spec)
  own = {} if path.endswith(".jinja") else _read_json(path, spec)
  templates = ({"default": _read_text(path)} if path.endswith(".jinja")
               else _named_templates(own.get("chat_template")))
  if not templates:
    raise DataError(f"chat template {spec!r}: {path} holds no chat_template")
  config = {**config, **{k: v for k, v in own.items() if k != "chat_template"}}
  have_config = bool(files) or any(k in own for k in TEMPLATE_TOKENS)
  added = _added_tokens(files, spec)
  template = template_from_config({k: v for k, v in config.items() if k != "chat_template"},
                                  path, name, templates=templates, added_tokens=added)
  if not have_config:   # no tokenizer beside it: its markers are its <|...|> strings
    template = template._replace(markers=tuple(sorted(set(re.findall(r"<\|[^|\s]+\|>",
                                                                     template.source)))))
  return _checked(template, spec, have_config)


def _checked(template: ChatTemplate, spec: str, have_config: bool) -> ChatTemplate:
  """``template``, once it compiles and, when no tokenizer configuration came with it, reads no
  special token (Jinja would render the undefined token as nothing, silently)."""
  read = set()
  for source in filter(None, (template.source, template.tool_source)):
    read |= template_variables(source)
  missing = sorted(read & set(TEMPLATE_TOKENS) - {k for k, _ in template.tokens})
  if missing and not have_config:
    raise DataError(f"chat template {spec!r} reads {missing}, which only a tokenizer "
                    f"configuration defines: put the template beside its {CONFIG_FILE}, or "
                    "point the template at the tokenizer's folder")
  return template


def load_chat_template(spec: str) -> ChatTemplate:
  """The template named by ``spec``.

  * ``"chatml"`` (default of the readers), ``"plain"``;
  * a tokenizer folder (``chat_template.jinja``, ``additional_chat_templates/<name>.jinja``,
    ``chat_template.json``, or the ``chat_template`` of its ``tokenizer_config.json``, in that
    order of precedence, as ``transformers`` reads them), or that folder's
    ``tokenizer_config.json``; ``path::name`` for one of its named templates;
  * a ``.jinja`` or ``.json`` template file, the special tokens taken from the
    ``tokenizer_config.json`` beside it; a ``.jinja`` file alone, with no configuration beside it,
    must not read ``bos_token``, ``eos_token``, ... (its markers are then the ``<|...|>`` strings
    in it);
  * ``"hf:<repo>[@revision]"``: the same files of a Hub model (cached; fails at once offline,
    see :mod:`andrea_jax.data.hfhub`).

  Example:
    >>> load_chat_template("chatml").markers
    ('<|im_start|>', '<|im_end|>')
  """
  if spec in ("chatml", ""):
    return CHATML
  if spec == "plain":
    return PLAIN
  path, _, name = spec.partition("::")
  if path.startswith("hf:"):
    return _from_files(_hub_files(path[3:], name, spec), name, spec, path)
  path = os.path.expanduser(path)
  if os.path.isdir(path) or os.path.basename(path) == CONFIG_FILE and os.path.isfile(path):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    files = _folder_files(folder)
    if CONFIG_FILE not in files and "chat_template.jinja" not in files and (
        "chat_template.json" not in files):
      raise DataError(f"chat template {spec!r}: the folder {folder} holds no {CONFIG_FILE}, "
                      "chat_template.jinja or chat_template.json")
    return _from_files(files, name, spec, files.get(CONFIG_FILE, folder))
  if os.path.isfile(path) and path.endswith((".jinja", ".json")):
    return _from_template_file(path, name, spec)
  raise DataError(f"chat template {spec!r}: neither 'chatml', 'plain', 'hf:<repo>', a tokenizer "
                  f"folder, its {CONFIG_FILE}, nor an existing .jinja or .json template file")


