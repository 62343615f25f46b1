"""One module per collective: its single-array, list and non-blocking paths side by side.

Each module's entry point takes a :class:`~hpccoll.Communicator` and a
``what`` (the public name, for error messages); validation comes from
:mod:`hpccoll._core.validate`, layout from :mod:`hpccoll._layout`, and every
path reaches the network through the communicator's transport object
(:meth:`~hpccoll.Communicator.transport_of`) and nothing else.
"""
