package encryption_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"

	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// testKMS wraps data keys under a master key with AES-256-GCM, the encryption context as
// AAD - what a key service does: a wrapped key unwraps only under the context it was made for.
type testKMS struct {
	master   []byte
	contexts []map[string]string
	down     bool
}

func (k *testKMS) WrapName() string { return "test-kms" }

func (k *testKMS) gcm() cipher.AEAD {
	b, _ := aes.NewCipher(k.master)
	g, _ := cipher.NewGCM(b)
	return g
}

func (k *testKMS) GenerateDataKey(_ context.Context, keyID string, c map[string]string) (encryption.DataKey, error) {
	if k.down {
		return encryption.DataKey{}, errors.New("connection refused")
	}
	k.contexts = append(k.contexts, c)
	plain := make([]byte, 32)
	_, _ = rand.Read(plain)
	aad, _ := json.Marshal(c)
	nonce := make([]byte, 12)
	_, _ = rand.Read(nonce)
	return encryption.DataKey{KeyID: "arn:test:" + keyID, Plaintext: plain, Wrapped: append(nonce, k.gcm().Seal(nil, nonce, plain, aad)...)}, nil
}

func (k *testKMS) DecryptDataKey(_ context.Context, keyID string, wrapped []byte, c map[string]string) ([]byte, error) {
	k.contexts = append(k.contexts, c)
	aad, _ := json.Marshal(c)
	if len(wrapped) < 12 {
		return nil, prismerr.New("decryption_failed", "refused", "").At("security.encryption.encapsulated_key")
	}
	out, err := k.gcm().Open(nil, wrapped[:12], wrapped[12:], aad)
	if err != nil {
		return nil, prismerr.New("decryption_failed", "refused", "").At("security.encryption.encapsulated_key")
	}
	return out, nil
}

func kmsEnvelope(t *testing.T, k *testKMS, alg string) *envelope.Envelope {
	t.Helper()
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]any{"order_id": 1}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := encryption.EncryptWithDataKey(context.Background(), env, alg, "alias/orders", k, encryption.Options{}); err != nil {
		t.Fatal(err)
	}
	return env
}

func TestKeyWrapRoundTripAndRefusals(t *testing.T) {
	k := &testKMS{master: make([]byte, 32)}
	kr := encryption.NewKeyring()
	kr.DataKeys[k.WrapName()] = k
	for _, alg := range []string{encryption.AES256GCM, encryption.ChaCha20Poly1305} {
		env := kmsEnvelope(t, k, alg)
		meta := env.Header.GetSecurity().GetEncryption()
		if meta.GetAlgorithmParams() != `{"key_wrap":"test-kms"}` || meta.GetKeyId() != "arn:test:alias/orders" || len(meta.GetEncapsulatedKey()) != 60 {
			t.Fatalf("%s: metadata %v", alg, meta)
		}
		wire, _ := envelope.Encode(env, envelope.Reviewed)
		got, _ := envelope.Decode(wire)
		plain, err := encryption.Decrypt(got, kr, encryption.DecryptOptions{})
		if err != nil || string(plain) != `{"order_id":1}` {
			t.Fatalf("%s: %q %v", alg, plain, err)
		}
	}
	want := map[string]string{"prism:message_id": k.contexts[0]["prism:message_id"], "prism:namespace": "order-events", "prism:topic": "orders.created"}
	if len(k.contexts[0]) != 3 || k.contexts[0]["prism:topic"] != want["prism:topic"] || k.contexts[0]["prism:namespace"] != want["prism:namespace"] {
		t.Fatalf("encryption context %v", k.contexts[0])
	}

	decrypt := func(edit func(*envelope.Envelope), keys *encryption.Keyring) error {
		env := kmsEnvelope(t, k, encryption.AES256GCM)
		edit(env)
		wire, _ := envelope.Encode(env, envelope.Reviewed)
		got, err := envelope.Decode(wire)
		if err != nil {
			t.Fatal(err)
		}
		_, err = encryption.Decrypt(got, keys, encryption.DecryptOptions{})
		return err
	}
	other := kmsEnvelope(t, k, encryption.AES256GCM).Header.Security.Encryption.EncapsulatedKey
	for name, c := range map[string]struct {
		edit func(*envelope.Envelope)
		keys *encryption.Keyring
		want error
	}{
		"no provider": {func(*envelope.Envelope) {}, encryption.NewKeyring(), prismerr.ErrKeyNotUsable},
		"other wrap name": {func(e *envelope.Envelope) {
			s := `{"key_wrap":"aws-kms"}`
			e.Header.Security.Encryption.AlgorithmParams = &s
		}, kr, prismerr.ErrKeyNotUsable},
		"non-string key_wrap": {func(e *envelope.Envelope) { s := `{"key_wrap":5}`; e.Header.Security.Encryption.AlgorithmParams = &s }, kr, prismerr.ErrKeyNotUsable},
		"missing wrapped key": {func(e *envelope.Envelope) { e.Header.Security.Encryption.EncapsulatedKey = nil }, kr, prismerr.ErrDecryption},
		"swapped wrapped key": {func(e *envelope.Envelope) { e.Header.Security.Encryption.EncapsulatedKey = other }, kr, prismerr.ErrDecryption},
		"flipped wrapped key": {func(e *envelope.Envelope) { e.Header.Security.Encryption.EncapsulatedKey[20] ^= 1 }, kr, prismerr.ErrDecryption},
		"flipped ciphertext": {func(e *envelope.Envelope) {
			v, _ := e.Payload.Value()
			v[0] ^= 1
		}, kr, prismerr.ErrDecryption},
		"moved to another topic": {func(e *envelope.Envelope) { e.Header.Metadata.Topic = "orders.refunded" }, kr, prismerr.ErrDecryption},
	} {
		if err := decrypt(c.edit, c.keys); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// an unwrapped context mismatch (AAD relaxed) is still refused by the key service
	env := kmsEnvelope(t, k, encryption.AES256GCM)
	env.Header.Metadata.MessageId = "0190a000-0000-7000-8000-000000000099"
	env.Header.Security.Encryption.Aad = nil
	no := false
	if _, err := encryption.Decrypt(env, kr, encryption.DecryptOptions{RequireAAD: &no}); !errors.Is(err, prismerr.ErrDecryption) {
		t.Errorf("context mismatch: %v", err)
	}
	// a key service that is down: typed, transient
	k.down = true
	e2, _ := envelope.NewJSON("orders.created", "order-events", 1, envelope.Options{})
	if err := encryption.EncryptWithDataKey(context.Background(), e2, encryption.AES256GCM, "alias/orders", k, encryption.Options{}); !errors.Is(err, prismerr.ErrKeyProvider) || e2.IsEncrypted() {
		t.Errorf("down: %v", err)
	}
	if err := encryption.EncryptWithDataKey(context.Background(), e2, encryption.MLKEM1024, "alias/orders", k, encryption.Options{}); !errors.Is(err, prismerr.ErrAlgorithm) {
		t.Errorf("ml-kem with a data key: %v", err)
	}
}
