package encryption_test

import (
	"bytes"
	"crypto/ecdh"
	"crypto/mlkem"
	"encoding/hex"
	"testing"

	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
)

type vectorFile struct {
	Keys    map[string]map[string]string `json:"keys"`
	Vectors []struct {
		Name         string `json:"name"`
		Layout       string `json:"layout"`
		EnvelopeHex  string `json:"envelope_hex"`
		Expected     string `json:"expected"`
		PlaintextHex string `json:"plaintext_hex"`
		AADHex       string `json:"aad_hex"`
	} `json:"vectors"`
}

func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vectorKeyring loads the vector file's keys into a Keyring (and checks each public key
// is the one the private key derives).
func vectorKeyring(t testing.TB, f vectorFile) *encryption.Keyring {
	kr := encryption.NewKeyring()
	for id, k := range f.Keys {
		switch k["type"] {
		case "symmetric-256":
			kr.Symmetric[id] = mustHex(t, k["secret_hex"])
		case "ml-kem-1024":
			dk, err := mlkem.NewDecapsulationKey1024(mustHex(t, k["private_seed_hex"]))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dk.EncapsulationKey().Bytes(), mustHex(t, k["public_key_hex"])) {
				t.Fatalf("%s: public key does not match the seed", id)
			}
			kr.MLKEM1024[id] = dk
		case "x25519-ml-kem-1024":
			x, err := ecdh.X25519().NewPrivateKey(mustHex(t, k["x25519_private_hex"]))
			if err != nil {
				t.Fatal(err)
			}
			dk, err := mlkem.NewDecapsulationKey1024(mustHex(t, k["ml_kem_private_seed_hex"]))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(x.PublicKey().Bytes(), mustHex(t, k["x25519_public_hex"])) || !bytes.Equal(dk.EncapsulationKey().Bytes(), mustHex(t, k["ml_kem_public_hex"])) {
				t.Fatalf("%s: public keys do not match", id)
			}
			kr.Hybrid[id] = &encryption.HybridPrivateKey{X25519: x, MLKEM: dk}
		default:
			t.Fatalf("key %s: unknown type %q", id, k["type"])
		}
	}
	return kr
}

// TestEncryptionVectors decrypts every vector of conformance/encryption/ with the default
// policy (AAD required) and checks the plaintext, the AAD, or the error kind.
func TestEncryptionVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "encryption")
	paths, err := conformance.FilesOfKind("encryption")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		var f vectorFile
		if err := conformance.File(path, &f); err != nil {
			t.Fatal(err)
		}
		runEncryption(t, f, &ran)
	}
}

func runEncryption(t *testing.T, f vectorFile, ran *conformance.Counter) {
	kr := vectorKeyring(t, f)
	for _, v := range f.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			ran.Ran()
			env, err := envelope.Decode(mustHex(t, v.EnvelopeHex))
			if err != nil {
				t.Fatal(err)
			}
			if v.AADHex != "" {
				meta := env.Header.GetSecurity().GetEncryption()
				md := env.Header.GetMetadata()
				aad := encryption.BuildAAD(md.GetMessageId(), md.GetNamespace(), md.GetTopic(), meta.GetAlgorithm(), meta.GetKeyId())
				if !bytes.Equal(aad, mustHex(t, v.AADHex)) {
					t.Errorf("recomputed AAD:\n got %x\nwant %s", aad, v.AADHex)
				}
			}
			plain, err := encryption.Decrypt(env, kr, encryption.DecryptOptions{})
			if got := conformance.Verdict(err, "plaintext"); got != v.Expected {
				t.Fatalf("got %s (%v), want %s", got, err, v.Expected)
			}
			if err == nil && !bytes.Equal(plain, mustHex(t, v.PlaintextHex)) {
				t.Errorf("plaintext %x, want %s", plain, v.PlaintextHex)
			}
		})
	}
}

func conformanceFile(out *vectorFile) error { return conformance.File("encryption/vectors.json", out) }
