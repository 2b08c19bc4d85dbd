"""tests/practice: offline, on the CPU, against the installed TRL.

Nothing here may reach the Hugging Face Hub: the models are built from configs
with random weights and the tokenizers from a word list (``_tiny.py``).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
