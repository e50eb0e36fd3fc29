package encryption

import (
	"bytes"
	"crypto/ecdh"
	"crypto/mlkem"
	"encoding/hex"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
)

// TestEncryptionVectorIntermediates: where a vector of conformance/encryption/ gives the
// intermediate values (ML-KEM and X25519 shared secrets, the AEAD key), decryption computes
// exactly those (README.md, kind "encryption").
func TestEncryptionVectorIntermediates(t *testing.T) {
	paths, err := conformance.FilesOfKind("encryption")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string][]byte{}
	observe = func(name string, v []byte) { seen[name] = append([]byte(nil), v...) }
	defer func() { observe = func(string, []byte) {} }()
	checked := 0
	for _, path := range paths {
		var f struct {
			Keys    map[string]map[string]string `json:"keys"`
			Vectors []map[string]any             `json:"vectors"`
		}
		if err := conformance.File(path, &f); err != nil {
			t.Fatal(err)
		}
		kr := NewKeyring()
		for id, k := range f.Keys {
			h := func(name string) []byte { b, _ := hex.DecodeString(k[name]); return b }
			switch k["type"] {
			case "symmetric-256":
				kr.Symmetric[id] = h("secret_hex")
			case "ml-kem-1024":
				kr.MLKEM1024[id], _ = mlkem.NewDecapsulationKey1024(h("private_seed_hex"))
			case "x25519-ml-kem-1024":
				x, _ := ecdh.X25519().NewPrivateKey(h("x25519_private_hex"))
				m, _ := mlkem.NewDecapsulationKey1024(h("ml_kem_private_seed_hex"))
				kr.Hybrid[id] = &HybridPrivateKey{X25519: x, MLKEM: m}
			}
		}
		for _, v := range f.Vectors {
			clear(seen)
			data, _ := hex.DecodeString(v["envelope_hex"].(string))
			env, err := envelope.Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = Decrypt(env, kr, DecryptOptions{})
			for _, name := range []string{"ml_kem_shared_secret", "x25519_shared_secret", "aead_key"} {
				want, ok := v[name+"_hex"].(string)
				if !ok {
					continue
				}
				checked++
				if w, _ := hex.DecodeString(want); !bytes.Equal(seen[name], w) {
					t.Errorf("%s: %s = %x, want %s", v["name"], name, seen[name], want)
				}
			}
		}
	}
	if checked < 6 {
		t.Fatalf("only %d intermediate values checked", checked)
	}
}
