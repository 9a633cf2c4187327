"""Model inspection: architecture facts from GGUF headers and Hugging Face folders.

Public surface::

    inspect_gguf(path) -> ModelFacts      # bounded header parse, no weights read
    inspect_hf(folder) -> ModelFacts      # config.json + safetensors headers
    ModelFacts                             # frozen, JSON round-trip via to_dict/from_dict
    InvalidModelFile(BadRequest)           # malformed or hostile input
"""

from appliance.modelfacts.errors import InvalidModelFile
from appliance.modelfacts.facts import ModelFacts
from appliance.modelfacts.gguf_facts import inspect_gguf
from appliance.modelfacts.hf import inspect_hf

__all__ = ["InvalidModelFile", "ModelFacts", "inspect_gguf", "inspect_hf"]
