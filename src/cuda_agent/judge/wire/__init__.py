"""What crosses between the judge's processes: worker processes and their channels, the typed messages of the call
socket, shared input and output buffers, tensor descriptions, and the timing loop both sides run."""
