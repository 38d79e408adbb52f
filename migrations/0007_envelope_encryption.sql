-- Envelope encryption: per-workspace data keys, stored only wrapped by the KMS, and trigger
-- signing secrets sealed with them instead of kept in plain text.
--
-- A data key is 32 random bytes; the row holds it wrapped by a key-encryption key the KMS
-- keeps (a key file outside the database, or a cloud KMS), never the key itself. New seals
-- use the workspace's newest unretired version; retired versions still open what they sealed.
-- Re-wrapping under a new KMS key version (rotation) rewrites `wrapped` and `kms_key_version`
-- only: nothing sealed is re-encrypted.
CREATE TABLE workspace_data_keys (
    workspace_id     text NOT NULL REFERENCES workspaces,
    version          integer NOT NULL CHECK (version > 0),
    kms_key_version  text NOT NULL CHECK (length(kms_key_version) BETWEEN 1 AND 512),
    wrapped          bytea NOT NULL CHECK (length(wrapped) BETWEEN 32 AND 8192),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Set when a newer version takes over new seals; the key still opens old ciphertexts.
    retired_at       timestamptz,
    PRIMARY KEY (workspace_id, version)
);

-- Re-wrapping finds the keys not yet under the KMS's current version.
CREATE INDEX workspace_data_keys_by_kms_version ON workspace_data_keys (kms_key_version);

-- Signing secrets are sealed (control_plane/crypto/envelope.py, purpose "trigger_secret",
-- bound to workspace, trigger and secret id). SQL cannot seal with the KMS, so rows written
-- before this migration keep their plain value until the control plane's startup backfill
-- seals them and clears it (control_plane/triggers/secrets.py); from then on the plain
-- column stays NULL. Exactly one of the two forms is present.
ALTER TABLE trigger_secrets ALTER COLUMN secret DROP NOT NULL;
ALTER TABLE trigger_secrets ADD COLUMN sealed bytea;
ALTER TABLE trigger_secrets ADD CONSTRAINT trigger_secret_one_form
    CHECK ((secret IS NULL) <> (sealed IS NULL));

-- What the backfill still has to seal (empty once it ran).
CREATE INDEX trigger_secrets_plaintext ON trigger_secrets (workspace_id, trigger_id)
    WHERE secret IS NOT NULL;
