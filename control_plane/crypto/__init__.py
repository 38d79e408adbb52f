"""Envelope encryption: secrets sealed with per-workspace data keys that a KMS wraps.

Two layers, each small enough to read in one sitting:

* `kms.py` — the key-encryption keys (KEKs). A `Kms` wraps and unwraps data keys and never
  hands out its own keys; `LocalKms` keeps them in a key file outside the database (dev and
  single-node); a cloud KMS or Vault transit implements the same Protocol.
* `envelope.py` — per-workspace data keys (32 random bytes each, stored only wrapped in
  `workspace_data_keys`) and `Envelope.seal` / `Envelope.open`: AES-256-GCM with a fresh
  96-bit nonce, the workspace, purpose and object id bound as associated data.

The database holds ciphertexts and wrapped data keys; neither is usable without the KMS.
"""
