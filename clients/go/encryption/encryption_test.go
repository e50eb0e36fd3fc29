package encryption_test

import (
	"bytes"
	"crypto/ecdh"
	"crypto/mlkem"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"testing"

	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
)

func newEnv(t *testing.T, payload []byte) *envelope.Envelope {
	t.Helper()
	env, err := envelope.NewBytes("orders.created", "order-events", payload, envelope.Options{ContentEncoding: "zstd"})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// roundTrip encrypts with enc, sends the envelope through both layouts' bytes, decrypts it
// and checks the plaintext; then checks a moved ciphertext fails.
func roundTrip(t *testing.T, name string, kr *encryption.Keyring, enc func(*envelope.Envelope) error) {
	t.Helper()
	plain := bytes.Repeat([]byte(`{"order_id":42}`), 40)
	for _, lay := range []envelope.Layout{envelope.Draft, envelope.Reviewed} {
		env := newEnv(t, plain)
		if err := enc(env); err != nil {
			t.Fatalf("%s: encrypt: %v", name, err)
		}
		if _, err := env.PayloadBytes(); !errors.Is(err, prismerr.ErrPayload) {
			t.Fatalf("%s: an encrypted payload must not read as plaintext: %v", name, err)
		}
		wire, err := envelope.Encode(env, lay)
		if err != nil {
			t.Fatal(err)
		}
		got, err := envelope.Decode(wire)
		if err != nil {
			t.Fatal(err)
		}
		clear, err := encryption.DecryptToEnvelope(got, kr, encryption.DecryptOptions{})
		if err != nil {
			t.Fatalf("%s/%v: decrypt: %v", name, lay, err)
		}
		if b, err := clear.PayloadBytes(); err != nil || !bytes.Equal(b, plain) {
			t.Fatalf("%s/%v: plaintext differs (%v)", name, lay, err)
		}
		got.Header.Metadata.Topic = "orders.other" // the ciphertext moved to another topic
		if _, err := encryption.Decrypt(got, kr, encryption.DecryptOptions{}); !errors.Is(err, prismerr.ErrDecryption) {
			t.Fatalf("%s: moved ciphertext: %v", name, err)
		}
	}
}

func TestEncryptDecryptEveryPattern(t *testing.T) {
	kr := encryption.NewKeyring()
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	kr.Symmetric["aes-1"] = secret
	roundTrip(t, "aes-256-gcm", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptSymmetric(e, "AES_256_GCM", "aes-1", secret, encryption.Options{})
	})
	roundTrip(t, "chacha20-poly1305", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptSymmetric(e, encryption.ChaCha20Poly1305, "aes-1", secret, encryption.Options{})
	})
	dk, _ := mlkem.GenerateKey1024()
	kr.MLKEM1024["kem-1"] = dk
	roundTrip(t, "ml-kem-1024", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptMLKEM1024(e, "kem-1", dk.EncapsulationKey(), encryption.Options{})
	})
	dk768, _ := mlkem.GenerateKey768()
	kr.MLKEM768["kem-768"] = dk768
	roundTrip(t, "ml-kem-768", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptMLKEM768(e, "kem-768", dk768.EncapsulationKey(), encryption.Options{})
	})
	x, _ := ecdh.X25519().GenerateKey(rand.Reader)
	hk, _ := mlkem.GenerateKey1024()
	kr.Hybrid["hyb-1"] = &encryption.HybridPrivateKey{X25519: x, MLKEM: hk}
	roundTrip(t, "x25519-ml-kem-1024", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptHybrid(e, "hyb-1", &encryption.HybridPublicKey{X25519: x.PublicKey(), MLKEM: hk.EncapsulationKey()}, encryption.Options{})
	})
	rk, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	kr.RSA["rsa-1"] = rk
	roundTrip(t, "rsa-oaep-3072 (wrapped)", kr, func(e *envelope.Envelope) error {
		return encryption.EncryptRSA(e, "rsa-1", &rk.PublicKey, encryption.Options{})
	})
}

func TestPolicyRefusesDeprecatedAndNonFIPS(t *testing.T) {
	secret := make([]byte, 32)
	for _, alg := range []string{"aes-128-gcm", "rsa-2048", "3des", "kyber1024", "rot13"} {
		err := encryption.EncryptSymmetric(newEnv(t, []byte("x")), alg, "k", secret, encryption.Options{})
		if !errors.Is(err, prismerr.ErrAlgorithm) {
			t.Errorf("%s: %v", alg, err)
		}
	}
	err := encryption.EncryptSymmetric(newEnv(t, []byte("x")), encryption.ChaCha20Poly1305, "k", secret, encryption.Options{Policy: encryption.Policy{FIPSMode: true}})
	if !errors.Is(err, prismerr.ErrAlgorithm) {
		t.Errorf("chacha20 in FIPS mode: %v", err)
	}
	env := newEnv(t, []byte("x"))
	if err := encryption.EncryptSymmetric(env, encryption.AES256GCM, "k", secret, encryption.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := encryption.EncryptSymmetric(env, encryption.AES256GCM, "k", secret, encryption.Options{}); !errors.Is(err, prismerr.ErrEncryption) {
		t.Errorf("double encryption: %v", err)
	}
	if _, err := encryption.Decrypt(env, encryption.NewKeyring(), encryption.DecryptOptions{}); !errors.Is(err, prismerr.ErrUnknownKey) {
		t.Errorf("unknown key: %v", err)
	}
}

// TestSignAfterEncrypt: a signature covers the ciphertext; verify, then decrypt.
func TestSignAfterEncrypt(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	env := newEnv(t, []byte(`{"a":1}`))
	if err := encryption.EncryptSymmetric(env, encryption.AES256GCM, "k", secret, encryption.Options{}); err != nil {
		t.Fatal(err)
	}
	key, _ := signing.NewHMACKey("s", secret)
	wire, err := signing.Sign(env, key, envelope.Reviewed, signing.ScopeV2)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := signing.VerifyAndDecode(wire, signing.NewKeys(key.VerificationKey()), signing.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kr := encryption.NewKeyring()
	kr.Symmetric["k"] = secret
	clear, err := encryption.DecryptToEnvelope(got, kr, encryption.DecryptOptions{})
	if err != nil || clear.Header.GetSecurity().GetSignature() != nil {
		t.Fatalf("decrypt after verify: %v", err)
	}
}

// FuzzDecrypt: decrypting any mutation of the vector envelopes gives plaintext or a typed
// error, never a panic.
func FuzzDecrypt(f *testing.F) {
	var vf vectorFile
	if err := conformanceFile(&vf); err != nil {
		f.Fatal(err)
	}
	for _, v := range vf.Vectors {
		f.Add(mustHex(f, v.EnvelopeHex))
	}
	kr := vectorKeyring(f, vf)
	// the key_wrap vectors too, with their table as the key service (the key_wrap path)
	var kw keyWrapFile
	if err := conformance.File("key-wrap/vectors.json", &kw); err != nil {
		f.Fatal(err)
	}
	for _, v := range kw.Vectors {
		f.Add(mustHex(f, v.EnvelopeHex))
	}
	kr.DataKeys[kw.WrapName] = &tableService{f: &kw}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := envelope.Decode(data)
		if err != nil {
			return
		}
		_, err = encryption.Decrypt(env, kr, encryption.DecryptOptions{})
		var pe *prismerr.Error
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("untyped error: %v", err)
		}
	})
}

// TestDecryptWithoutKeyringIsAnError: a nil *Keyring (none configured) holds no key; it was a
// nil pointer dereference inside Decrypt.
func TestDecryptWithoutKeyringIsAnError(t *testing.T) {
	env := newEnv(t, []byte("secret"))
	key := bytes.Repeat([]byte{3}, 32)
	if err := encryption.EncryptSymmetric(env, encryption.AES256GCM, "k1", key, encryption.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := encryption.Decrypt(env, nil, encryption.DecryptOptions{}); !errors.Is(err, prismerr.ErrUnknownKey) {
		t.Fatalf("%v", err)
	}
}
