"""Numeric checks: run graphs and models and compare what they compute.

* :mod:`edge.check.compare`: the comparator (:class:`~edge.check.compare.Tolerance`) and ONNX
  Runtime sessions and their log; pure numpy and ONNX Runtime.
* :mod:`edge.check.plugin_ops`: edge's TensorRT plugin ops in ONNX (``edge clean --plugins``) and
  how ONNX Runtime runs them here, as their numpy references; pure ONNX.
* :mod:`edge.check.feeds`: the inputs a graph is verified on and the comparison of all its
  outputs (the graph passes check each change with it); pure ONNX.
* :mod:`edge.check.torch_compare`: an ONNX graph against the PyTorch model it came from.
* :mod:`edge.check.onnx_classifier`: an ONNX graph called like a PyTorch classifier.
* :mod:`edge.check.verify`: ``edge verify``, two models or graphs that are handed in.
* :mod:`edge.check.accuracy`: ``edge eval``, a classifier's accuracy on a data set.

A check compares what it is given: loading a model (a name, a compressed artifact) is the
caller's business, so this package never imports :mod:`edge.compress`.
"""
