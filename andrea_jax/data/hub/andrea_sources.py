"""Public Hugging Face datasets for ANDREA-120M's named sources, where one is named with confidence.

The source document names ten sources but no dataset for any of them. :data:`HUB_SOURCES` maps a
source to a public dataset whose name, subset, split and fields were checked against the Hub's own
pages (dataset cards, file trees, dataset viewer) or, where a card is silent, against public code
that reads the dataset; each entry says which and what it rests on. :data:`UNVERIFIED` lists the
sources left for the user to set, with the reason. A choice of dataset for a source the seed only
names (``chat``, ``gutenberg``) is this module's choice, not the seed's.

The entries were checked by reading those pages, not by downloading the datasets (this repository is
tested without network): field names and shapes are as the pages state them. Run one source with a
small ``max_tokens`` before a long preparation.

Example:
  >>> from andrea_jax.data.hub.andrea_sources import HUB_SOURCES
  >>> HUB_SOURCES["smoltalk"].spec.dataset
  'HuggingFaceTB/smoltalk'
"""

from __future__ import annotations

from typing import NamedTuple

from andrea_jax.data.hub.spec import HubSpec


class VerifiedSource(NamedTuple):
  """A source's dataset, how its rows look, and where that was read.

  Attributes:
    spec: the :class:`~andrea_jax.data.hub.datasets.HubSpec` that reads it (add ``max_tokens`` as needed).
    shape: the fields a row holds that the spec reads, and their values.
    evidence: the pages (URLs) the name, split and fields were checked against.
    notes: what a user should know before training on it.
  """
  spec: HubSpec
  shape: str
  evidence: tuple[str, ...]
  notes: str


HUB_SOURCES: dict[str, VerifiedSource] = {
    "smoltalk": VerifiedSource(
        spec=HubSpec("HuggingFaceTB/smoltalk", subset="all", split="train", layout="messages",
                     messages_field="messages"),
        shape="messages: list of {content: str, role: str}, roles system/user/assistant; "
              "subsets (data/<subset>/) all, apigen-80k, everyday-conversations, "
              "explore-instruct-rewriting, longalign, metamathqa-50k, numina-cot-100k, "
              "openhermes-100k, self-oss-instruct, smol-constraints, smol-magpie-ultra, "
              "smol-rewrite, smol-summarize, systemchats-30k; splits train and test",
        evidence=(
            "https://huggingface.co/datasets/HuggingFaceTB/smoltalk/tree/main/data",
            "https://huggingface.co/datasets/HuggingFaceTB/smoltalk/tree/main/data/systemchats-30k",
            "https://huggingface.co/datasets/HuggingFaceTB/smol-smoltalk/blob/main/README.md",
        ),
        notes="The subsets and the train/test files are on the Hub's file tree. The messages field "
              "and its role/content shape are stated in the card of the sibling smol-smoltalk "
              "(built from SmolTalk) and read so by public code "
              "(load_dataset('HuggingFaceTB/smoltalk', 'all', split='train')['messages']); "
              "SmolTalk's own card text was not available to check."),
    "oasst": VerifiedSource(
        spec=HubSpec("OpenAssistant/oasst1", split="train", layout="tree", text_field="text"),
        shape="one row per message: message_id, parent_id (None at the initial prompt), text, "
              "role 'prompter' or 'assistant', lang, message_tree_id, deleted, review_result, "
              "rank, ...; splits train and validation",
        evidence=(
            "https://huggingface.co/datasets/OpenAssistant/oasst1/commit/"
            "c267a21727a37680e70898f80a631941c4756a89",
            "https://huggingface.co/datasets/OpenAssistant/oasst1/commit/"
            "37d790373da332a4c8be24bd29ec1550e7f04c3f",
            "https://huggingface.co/datasets/chrystians/oasst1_pl_2_2/blob/"
            "f436a5444529086f130bcb19e6f8db1aa7b1070a/README.md",
        ),
        notes="The card describes message trees (initial prompt as root, roles prompter/assistant "
              "strictly alternating along a thread); the column list is from a derived dataset "
              "with oasst1's schema. 35 languages: add filter_field='lang', filter_value='en' "
              "for English threads only. The splits were cut by tree (Open-Assistant's "
              "oasst-data/examples/split_dataset.py), so a split holds whole trees. Whether a "
              "split holds messages whose parent is absent was not checked: the tree layout "
              "stops with an error naming the row if so. oasst2 (OpenAssistant/oasst2) has the "
              "same structure and was not checked further."),
    "gutenberg": VerifiedSource(
        spec=HubSpec("manu/project_gutenberg", split="en", layout="text", text_field="text"),
        shape="id: str, text: str (a whole book); one split per language: de, en (61.3k rows), "
              "es, fr, it, nl, pl, pt, ru, sv, zh",
        evidence=(
            "https://huggingface.co/datasets/manu/project_gutenberg/viewer",
            "https://huggingface.co/datasets/manu/project_gutenberg/blob/"
            "a1c8a9e058263cf055278c22ce34c277a4766b44/README.md",
        ),
        notes="Each row is a whole book, Project Gutenberg's license header and footer "
              "presumably included (not checked). The card has no description beyond its "
              "features; about 61k English books is far more than ANDREA-120M's share of "
              "gutenberg needs: set max_tokens, and streaming=True to avoid downloading it all."),
    "chat": VerifiedSource(
        spec=HubSpec("lmsys/lmsys-chat-1m", split="train", layout="messages",
                     messages_field="conversation"),
        shape="conversation: list of {content: str, role: str} (OpenAI format), "
              "conversation_id, model, turn, language (detected, a string), openai_moderation; "
              "split train, 1,000,000 conversations",
        evidence=(
            "https://huggingface.co/datasets/lmsys/lmsys-chat-1m",
            "https://huggingface.co/datasets/AarushSah/lmsys-chat-1m/blob/main/README.md",
        ),
        notes="The seed names a 'chat' source without a dataset; this is a real-conversation "
              "set of the kind (ShareGPT/Chatbot Arena). Gated: accept its license on the Hub "
              "and set HF_TOKEN. 154 languages; the values of the language tag were not checked, "
              "so no language filter is set. The field list is from a copy of the card's YAML "
              "(the gated card shows the description, not the YAML, without logging in)."),
}

UNVERIFIED: dict[str, str] = {
    "hermes3-general": "NousResearch/Hermes-3-Dataset (one split, train; a 'conversations' list "
                       "of from/value with from in system/human/gpt, per public code that reads "
                       "it) has no field documented as its general/creative/roleplay part: its "
                       "card is empty, so the three Hermes 3 sources cannot be cut from it by a "
                       "filter named with confidence. Gated (set HF_TOKEN).",
    "hermes3-creative": "see hermes3-general",
    "hermes3-roleplay": "see hermes3-general",
    "dictionary": "the dictionary datasets found (marksverdhei/wordnet-definitions-en-2021, "
                  "npvinHnivqn/EnglishDictionary: CSV files) hold a word and its definition in "
                  "separate columns whose names were not verified, and a text source reads one "
                  "field: join them into a text column (or a JSONL file) first.",
    "repo-docs": "the documentation of a code repository the seed does not name; no public "
                 "dataset is it.",
    "repo-docstrings": "the docstrings of a code repository the seed does not name; no public "
                       "dataset is it.",
}
