"""Trainer-facing iterators: ``loaders.open(config)`` returns an iterable of batches.

See :mod:`loaders.loader`; Caffe's DataTransformer is in :mod:`loaders.transform` and the
PyTorch adapter in :mod:`loaders.torch_adapter` (imports torch only when used).
"""

from loaders.assemble import Batch
from loaders.loader import Loader, open

__all__ = ["Batch", "Loader", "open"]
