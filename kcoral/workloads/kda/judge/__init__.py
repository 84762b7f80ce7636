"""The KDA forward judge: inputs, references, correctness gate and timer.

Shipped with every bench and run on the server, so it depends only on the standard
library, NumPy and ml_dtypes, plus CuPy / torch / fla when the server has them.
"""
