"""The vLLM engine (:mod:`.engine`), its live weights in vLLM's own parameters (:mod:`.layout`,
:mod:`.weights`, :mod:`.kernels`) or through vLLM's loaders (:mod:`.patch_weights`), and the
``aurora`` weight-transfer backend (:mod:`.transfer`). Nothing here imports vllm at import time."""
