"""The cost model: compute, communication, memory and pipeline schedule of a layout."""
