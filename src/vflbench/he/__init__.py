"""Two-party Paillier homomorphic encryption for the ``paillier_he`` baseline (as :mod:`vflbench.mpc`
is for VMask's secret sharing).

Keys come from python-paillier (``phe``, the optional ``he`` extra), imported only when keys are
made or rebuilt. Each party holds only its own half; the halves talk through ``paillier.*``
messages on the parties' channel endpoints, which the channel counts with all other traffic.

* :mod:`~vflbench.he.keys`: phe key pairs, the public key's wire format.
* :mod:`~vflbench.he.encoding`: fixed-point encoding, :class:`EncTensor` (ciphertexts with a scale).
* :mod:`~vflbench.he.ops`: vectorised homomorphic arithmetic on raw ciphertexts, ciphertext bytes.
* :mod:`~vflbench.he.holder`: the key holder (active party): decryption, its embedding shares,
  rescaling; the ``paillier.*`` request handler.
* :mod:`~vflbench.he.layers`: the passive party's encrypted interactive layer and its link to the
  key holder; the active party's share-combining top model.
"""

from vflbench.he.encoding import KAPPA, MAG, EncTensor, encode, signed
from vflbench.he.holder import NAMESPACE, PUBLIC_KEY, RESCALE, SHARE, PaillierKeyHolder
from vflbench.he.keys import HE_EXTRA, generate_keypair, load_phe, public_key_from_wire, public_key_to_wire
from vflbench.he.layers import HolderRef, KeyHolderLink, PaillierLinear, ShareCombiningTop, replace_last_linear
from vflbench.he.ops import PaillierOps

__all__ = [
    "HE_EXTRA",
    "KAPPA",
    "MAG",
    "NAMESPACE",
    "PUBLIC_KEY",
    "RESCALE",
    "SHARE",
    "EncTensor",
    "HolderRef",
    "KeyHolderLink",
    "PaillierKeyHolder",
    "PaillierLinear",
    "PaillierOps",
    "ShareCombiningTop",
    "encode",
    "generate_keypair",
    "load_phe",
    "public_key_from_wire",
    "public_key_to_wire",
    "replace_last_linear",
    "signed",
]
