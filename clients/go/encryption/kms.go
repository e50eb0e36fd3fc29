package encryption

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// The key_wrap pattern (envelope encryption with a key service, AWS KMS's GenerateDataKey /
// Decrypt; app/security/keys.py AwsKmsProvider): per message the service returns a fresh
// 32-byte data key and its copy wrapped under a master key that never leaves the service.
// The payload is encrypted with the data key (aes-256-gcm or chacha20-poly1305, the AAD as
// for any shared key); the wrapped copy goes to encapsulated_key, the master key's id (the
// service's answer, e.g. a key ARN) to key_id, and algorithm_params is
// {"key_wrap":"<WrapName>"}. The service authenticates an encryption context that binds the
// wrapped key to its envelope (KMSContext): a wrapped key moved to another message does not
// unwrap.

// DataKeyProvider is a key service that wraps data keys. Implementations return
// *prismerr.Error values where they can (unknown_key, key_not_usable, decryption_failed for
// a refused wrapped key, key_provider_failed for an outage); any other error is reported as
// key_provider_failed.
type DataKeyProvider interface {
	// WrapName is recorded in algorithm_params.key_wrap ("aws-kms" for AWS KMS, as in Python).
	WrapName() string
	// GenerateDataKey returns a fresh 32-byte key, its wrapped copy and the key id to record.
	GenerateDataKey(ctx context.Context, keyID string, encryptionContext map[string]string) (DataKey, error)
	// DecryptDataKey unwraps a data key under the same encryption context.
	DecryptDataKey(ctx context.Context, keyID string, wrapped []byte, encryptionContext map[string]string) ([]byte, error)
}

// DataKey is one answer of GenerateDataKey.
type DataKey struct {
	KeyID     string // the master key that wrapped it (what the envelope's key_id records)
	Plaintext []byte // 32 bytes; never stored
	Wrapped   []byte // what the envelope's encapsulated_key carries
}

// KMSContext is the encryption context Prism passes to the key service for an envelope:
// its message id, namespace and topic (the Python worker's _kms_context).
func KMSContext(env *envelope.Envelope) map[string]string {
	md := env.Header.GetMetadata()
	return map[string]string{"prism:message_id": md.GetMessageId(), "prism:namespace": md.GetNamespace(), "prism:topic": md.GetTopic()}
}

// EncryptWithDataKey encrypts the payload with a fresh data key from p (aes-256-gcm or
// chacha20-poly1305), under the master key keyID.
func EncryptWithDataKey(ctx context.Context, env *envelope.Envelope, algorithm, keyID string, p DataKeyProvider, opts Options) error {
	s, plaintext, err := begin(env, algorithm, opts)
	if err != nil {
		return err
	}
	if s.pattern != symmetric {
		return algErr(algorithm+" is not a shared-key algorithm", "the key_wrap pattern wraps aes-256-gcm or chacha20-poly1305 data keys")
	}
	if p == nil {
		return prismerr.New("bad_config", "no DataKeyProvider", "pass the key service's provider").At("EncryptWithDataKey")
	}
	dk, err := p.GenerateDataKey(ctx, keyID, KMSContext(env))
	if err != nil {
		return providerErr(err, "wrap")
	}
	if dk.KeyID == "" {
		dk.KeyID = keyID
	}
	if len(dk.Wrapped) == 0 {
		return prismerr.New("key_provider_failed", "the key service returned no wrapped data key", "").At("security.encryption.encapsulated_key")
	}
	c, err := aead(s.name, dk.Plaintext)
	if err != nil {
		return err
	}
	params, _ := json.Marshal(map[string]string{"key_wrap": p.WrapName()})
	ps := string(params)
	meta := &reviewedpb.EncryptionMetadata{KeyId: dk.KeyID, Algorithm: s.name, EncryptionType: s.encryptionType(), Iv: nonce(),
		EncapsulatedKey: dk.Wrapped, AlgorithmParams: &ps}
	meta.Aad = envelopeAAD(env, meta.Algorithm, meta.KeyId)
	finish(env, meta, c.Seal(nil, meta.Iv, plaintext, meta.Aad))
	return nil
}

// providerErr keeps a provider's typed error and types any other one as key_provider_failed.
func providerErr(err error, purpose string) error {
	var pe *prismerr.Error
	if errors.As(err, &pe) {
		return err
	}
	return prismerr.New("key_provider_failed", "the key service failed to "+purpose+" the data key: "+err.Error(),
		"check the key service's availability and this client's permissions; retry later").At("security.encryption.key_id")
}

// truthy is Python's truth value of a JSON value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case float64:
		return x != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}
