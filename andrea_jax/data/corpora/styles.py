"""The sixteen document styles of the synthetic built-in corpus (see :mod:`andrea_jax.data.corpora.synthetic`).

Each style is ``make(stream, target_chars) -> list[str]`` (documents). They differ on purpose so
that a curriculum has something to find:

* easy, templated: ``dictionary`` (a fixed lexicon of ``word (pos.): definition`` entries, each
  repeated several times), ``repo-docstrings`` (Python functions with docstrings), ``extra-01``
  (arithmetic), ``extra-05`` (number sequences), ``extra-02`` (CSV tables), ``extra-03`` (logs);
* prose from Markov chains, each source with its own vocabulary, branching and layout: instruction
  / response (``hermes3-general``), stories and poems (``hermes3-creative``), dialogue turns
  (``hermes3-roleplay`` with actions, ``chat``, ``smoltalk``, ``oasst``), long archaic sentences
  (``gutenberg``), and a high-entropy foreign-looking language with non-ASCII letters
  (``extra-04``);
* ``repo-docs``: markdown-like READMEs, half of which carry one of five long fixed passages
  verbatim (the "zombie cliff": a model memorises them and reaches near-zero loss on them);
* ``extra-06``: pure noise, uniformly random printable ASCII (0x20..0x7E): nothing to learn, its
  loss floor is ln 95 = 4.55 nats per byte.
"""

from __future__ import annotations

from collections.abc import Callable

from andrea_jax.data.corpora.textgen import (Chain, SentencePool, Stream, fill, make_chain, make_words,
                                     roman)

FUNCTION_WORDS = (
    "the of and to a in is it that was for on with as he she they be at by this had not are but "
    "from or have an which one you were her all their there can we so if would what about when "
    "will more no out up into some could them than then its only other also over after most our "
    "these").split()
ARCHAIC_WORDS = ("thee thou thy hath doth upon whilst ere nay yea shall art wherefore hither "
                 "thence alas betwixt oft perchance").split()
NOUNS = ("stone river light house number order rule field point road tree voice letter table "
         "garden signal market shadow window engine pattern island winter system bridge mirror "
         "lamp harbour record value circle").split()
VERBS = ("carry measure open hold build follow mark turn break gather keep send count store move "
         "join shape fold cover read").split()
ADJECTIVES = ("small bright narrow quiet heavy simple early round hollow sharp plain green distant "
              "warm thin final common hidden").split()
CODE_VERBS = ("get set load parse compute update build find merge split render read write "
              "check").split()
CODE_NOUNS = ("config path token batch index record buffer header schema vector node cache layer "
              "stream table").split()

_LATIN = dict(onsets="b c d f g h l m n p r s t v w br cl dr st tr pl".split(),
              nuclei="a e i o u ea ou ai".split(),
              codas=["", "", "", "n", "r", "s", "t", "l", "nd"])
_FOREIGN = dict(onsets="k q x z zh kv ts gh ř ð þ".split(), nuclei="á ø ü y ä ō ï".split(),
                codas=["", "", "k", "x", "ŋ", "ß", "rt"])


def _prose(stream: Stream, n_words: int, branching: int, extra: tuple[str, ...] = ()) -> Chain:
  words = make_words(stream, n_words, **_LATIN, exclude=FUNCTION_WORDS)
  return make_chain(stream, list(FUNCTION_WORDS) + list(extra) + words, branching)


def hermes3_general(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 3000, 6)
  q = SentencePool(s, chain, 8, 16, endings="?")
  a = SentencePool(s, chain, 10, 22, comma=40)
  return fill(target, lambda: f"### Instruction:\n{q.take(1)[0]}\n\n### Response:\n"
              + "\n\n".join(a.paragraph(3, 6) for _ in range(s.int(2, 4))))


def hermes3_creative(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 4000, 10, extra=tuple(ADJECTIVES))
  prose = SentencePool(s, chain, 12, 30, comma=80, endings=".!", ending_weights=(9, 1))
  verse = SentencePool(s, chain, 5, 9, endings=",.", ending_weights=(3, 1))

  def doc() -> str:
    genre = s.pick(("story", "poem", "fable", "tale"))
    title = " ".join(w.title() for w in verse.take(1)[0][:-1].split()[:4])
    head = f"Write a {genre} about the {s.pick(NOUNS)}.\n\n{title}\n\n"
    if genre == "poem":
      return head + "\n\n".join("\n".join(verse.take(4)) for _ in range(s.int(3, 6)))
    return head + "\n\n".join(prose.paragraph(4, 8) for _ in range(s.int(3, 7)))
  return fill(target, doc)


def _names(s: Stream, n: int) -> list[str]:
  return [w.title() for w in make_words(s, n, **_LATIN, max_syllables=2)]


def hermes3_roleplay(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 2500, 8)
  speech = SentencePool(s, chain, 5, 14, comma=30, endings=".?!", ending_weights=(6, 2, 2))
  action = SentencePool(s, chain, 3, 6, endings=" ", capital=False)
  names = _names(s, 60)

  def doc() -> str:
    cast = (s.pick(names), s.pick(names))
    turns = []
    for i in range(s.int(8, 16)):
      said = " ".join(speech.take(s.int(1, 3)))
      turns.append(f"{cast[i % 2]}: *{action.take(1)[0].strip()}* \"{said}\"")
    return "\n".join(turns)
  return fill(target, doc)


def _turns(s: Stream, roles: tuple[str, str], ask: SentencePool, answer: SentencePool,
           asked: tuple[int, int], answered: tuple[int, int], turns: tuple[int, int],
           sep: str) -> str:
  return sep.join(f"{roles[0]}{' '.join(ask.take(s.int(*asked)))}{sep}"
                  f"{roles[1]}{' '.join(answer.take(s.int(*answered)))}"
                  for _ in range(s.int(*turns)))


def chat(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 2000, 5)
  ask = SentencePool(s, chain, 5, 12, endings="?.", ending_weights=(3, 1))
  answer = SentencePool(s, chain, 6, 14, comma=20)
  return fill(target, lambda: _turns(s, ("User: ", "Assistant: "), ask, answer, (1, 2), (2, 4),
                                     (2, 6), "\n"))


def smoltalk(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 800, 3)
  ask = SentencePool(s, chain, 4, 9, endings="?", capital=False)
  answer = SentencePool(s, chain, 5, 10, capital=False)
  return fill(target, lambda: _turns(s, ("[user] ", "[assistant] "), ask, answer, (1, 1), (2, 3),
                                     (1, 4), "\n"))


def oasst(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 3000, 7)
  ask = SentencePool(s, chain, 8, 20, endings="?")
  say = SentencePool(s, chain, 8, 18, comma=30)

  def answer() -> str:
    items = "\n".join(f"{i}. {t}" for i, t in enumerate(say.take(s.int(2, 5)), 1))
    return f"{say.take(1)[0]}\n{items}\n{say.take(1)[0]}" if s.chance(1, 2) else say.paragraph(3, 7)
  return fill(target, lambda: "\n\n".join(f"Prompter: {ask.take(1)[0]}\n\nAssistant: {answer()}"
                                          for _ in range(s.int(1, 3))))


def gutenberg(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 5000, 12, extra=tuple(ARCHAIC_WORDS))
  long = SentencePool(s, chain, 20, 45, comma=100, endings=".;!", ending_weights=(8, 1, 1))
  return fill(target, lambda: f"CHAPTER {roman(s.int(1, 60))}.\n\n" + "\n\n".join(
      long.paragraph(3, 6) for _ in range(s.int(2, 5))))


def dictionary(s: Stream, target: int) -> list[str]:
  heads = make_words(s, 2500, **_LATIN)
  templates = {
      "n.": lambda: (f"a {s.pick(ADJECTIVES)} {s.pick(NOUNS)} used to {s.pick(VERBS)} the "
                     f"{s.pick(NOUNS)}"),
      "v.": lambda: f"to {s.pick(VERBS)} a {s.pick(NOUNS)} until it is {s.pick(ADJECTIVES)}",
      "adj.": lambda: f"{s.pick(ADJECTIVES)} like a {s.pick(NOUNS)}; not {s.pick(ADJECTIVES)}",
      "adv.": lambda: f"in a {s.pick(ADJECTIVES)} manner, as when one would {s.pick(VERBS)}",
  }
  pos = list(templates)
  lexicon = []
  for h in heads:
    p = s.pick(pos)
    lexicon.append(f"{h} ({p}): {templates[p]()}.")
  return fill(target, lambda: "\n".join(sorted(lexicon[i] for i in s.below(len(lexicon),
                                                                           s.int(15, 40)))))


def repo_docs(s: Stream, target: int) -> list[str]:
  chain = _prose(s, 2000, 6)
  text = SentencePool(s, chain, 8, 18, comma=30)
  wild = SentencePool(s, _prose(s, 3000, 40), 10, 24, comma=60)
  passages = [" ".join(wild.take(14)) + "\n\n" + " ".join(wild.take(14)) for _ in range(5)]
  projects = [w.lower() for w in make_words(s, 200, **_LATIN)]

  def doc() -> str:
    p = s.pick(projects)
    parts = [f"# {p}", text.paragraph(2, 4), "## Installation", f"```bash\npip install {p}\n```",
             "## Usage", text.paragraph(1, 3),
             f"```python\nimport {p}\n"
             f"{p}.{s.pick(CODE_VERBS)}_{s.pick(CODE_NOUNS)}({s.int(0, 99)})\n```",
             f"## {s.pick(NOUNS).title()}", "\n".join(f"- {t}" for t in text.take(s.int(2, 5)))]
    if s.chance(1, 2):
      parts += ["## Notice", s.pick(passages)]
    return "\n\n".join(parts)
  return fill(target, doc)


def repo_docstrings(s: Stream, target: int) -> list[str]:
  def function() -> str:
    verb, noun, adj = s.pick(CODE_VERBS), s.pick(CODE_NOUNS), s.pick(ADJECTIVES)
    default = s.int(0, 16)
    other = s.pick([n for n in CODE_NOUNS if n != noun])
    return (f"def {verb}_{noun}({noun}, {other}={default}):\n"
            f"    \"\"\"{verb.title()}s the {adj} {noun} of the {other}.\n\n"
            f"    Args:\n        {noun}: The {noun} to {verb}.\n"
            f"        {other}: The {other}, by default {default}.\n\n"
            f"    Returns:\n        The {adj} {noun}.\n    \"\"\"\n"
            f"    return {noun}.{verb}({other})\n")
  return fill(target, lambda: f"\"\"\"Helpers for {s.pick(CODE_NOUNS)}s.\"\"\"\n\n\n" + "\n\n".join(
      function() for _ in range(s.int(3, 7))))


def extra_01_arithmetic(s: Stream, target: int) -> list[str]:
  def line() -> str:
    op = s.pick("+-*")
    a, b = (s.int(0, 99), s.int(0, 99)) if op == "*" else (s.int(0, 999), s.int(0, 999))
    return f"{a} {op} {b} = {a + b if op == '+' else a - b if op == '-' else a * b}"
  return fill(target, lambda: "\n".join(line() for _ in range(s.int(30, 80))))


def extra_02_tables(s: Stream, target: int) -> list[str]:
  names, cities = _names(s, 300), _names(s, 80)

  def doc() -> str:
    rows = ["id,name,city,age,score"]
    for i in range(1, s.int(40, 120) + 1):
      cents = s.int(0, 10000)
      rows.append(f"{i},{s.pick(names)},{s.pick(cities)},{s.int(18, 90)},"
                  f"{cents // 100}.{cents % 100:02d}")
    return "\n".join(rows)
  return fill(target, doc)


def extra_03_logs(s: Stream, target: int) -> list[str]:
  modules = [w.lower() for w in make_words(s, 30, **_LATIN, max_syllables=2)]
  messages = (lambda: f"request {s.int(1000, 9999)} served in {s.int(1, 900)} ms",
              lambda: f"cache miss for key {s.pick(CODE_NOUNS)}:{s.int(0, 999)}",
              lambda: f"retrying connection to {s.pick(modules)} (attempt {s.int(1, 5)})",
              lambda: f"loaded {s.int(1, 500)} {s.pick(CODE_NOUNS)}s from disk")

  def doc() -> str:
    t = s.int(0, 86400 * 300)
    lines = []
    for _ in range(s.int(40, 100)):
      t += s.int(0, 30)
      day, sec = divmod(t, 86400)
      level = s.pick(("INFO", "INFO", "WARN", "ERROR"))
      lines.append(f"2024-{day // 30 % 12 + 1:02d}-{day % 30 + 1:02d} {sec // 3600:02d}:"
                   f"{sec // 60 % 60:02d}:{sec % 60:02d} {level} "
                   f"[{s.pick(modules)}] {s.pick(messages)()}")
    return "\n".join(lines)
  return fill(target, doc)


def extra_04_foreign(s: Stream, target: int) -> list[str]:
  chain = make_chain(s, make_words(s, 6000, **_FOREIGN), 24)
  text = SentencePool(s, chain, 6, 20, comma=50)
  return fill(target, lambda: "\n\n".join(text.paragraph(3, 8) for _ in range(s.int(2, 6))))


def extra_05_sequences(s: Stream, target: int) -> list[str]:
  def line() -> str:
    kind = s.pick(("seq", "count", "squares", "double"))
    a, d, n = s.int(0, 200), s.int(1, 12), s.int(5, 14)
    values = {"seq": [a + i * d for i in range(n)], "count": [a + i for i in range(n)],
              "squares": [(a % 30 + i) ** 2 for i in range(n)],
              "double": [(a % 9 + 1) << i for i in range(n)]}[kind]
    return f"{kind}: {' '.join(map(str, values))}"
  return fill(target, lambda: "\n".join(line() for _ in range(s.int(20, 60))))


def extra_06_noise(s: Stream, target: int) -> list[str]:
  def doc() -> str:
    return (s.below(95, s.int(500, 4000)) + 0x20).astype("u1").tobytes().decode("ascii")
  return fill(target, doc)


STYLES: dict[str, Callable[[Stream, int], list[str]]] = {
    "hermes3-general": hermes3_general, "hermes3-creative": hermes3_creative,
    "hermes3-roleplay": hermes3_roleplay, "chat": chat, "smoltalk": smoltalk, "oasst": oasst,
    "gutenberg": gutenberg, "dictionary": dictionary, "repo-docs": repo_docs,
    "repo-docstrings": repo_docstrings, "extra-01": extra_01_arithmetic,
    "extra-02": extra_02_tables, "extra-03": extra_03_logs, "extra-04": extra_04_foreign,
    "extra-05": extra_05_sequences,
    "extra-06": extra_06_noise,
}
"""Source name -> document generator, in :data:`andrea_jax.sources.SOURCES` order."""

NOISE_SOURCE = "extra-06"
"""The source that no model can learn (uniformly random printable ASCII)."""
