"""Hugging Face datasets and chat data as sources: a plug-in of the data pipeline, imported only
when a source asks for it (``data.files.<source>.format = "hf"``, a chat template, a ``hf:``
tokenizer).

* :mod:`.spec` -- :class:`HubSpec`, what a Hub source is (the pipeline's only import from here);
* :mod:`.datasets` -- reading a dataset (a Hub name, a ``save_to_disk`` folder, data files) into
  documents, with :mod:`.rows` (rows to documents) and :mod:`.files` (cached Hub files, offline);
* :mod:`.chat` -- conversations in their three shapes (role/content, ShareGPT, OpenAssistant
  trees); :mod:`.templates` (ChatML, plain, Jinja) and :mod:`.template_files` (where a template is
  read from); :mod:`.masks` -- the tokens the loss counts (``loss_on``);
* :mod:`.andrea_sources` -- public datasets for ANDREA-120M's named sources.
"""

from andrea_jax.data.hub.spec import HubSpec

__all__ = ["HubSpec"]
