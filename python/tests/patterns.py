"""The bytes a test prefill process fills its storages with: word i of rank r's storage s."""
import numpy as np


def filled(nbytes, rank, storage):
    words = (np.arange(1, (nbytes + 7) // 8 + 1, dtype=np.uint64)
             + np.uint64(rank << 48 | storage << 40)) * np.uint64(0x9E3779B97F4A7C15)
    return words.view(np.uint8)[:nbytes].copy()
