package encryption

import (
	"crypto/ecdh"
	"crypto/mlkem"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// LoadFileKeyring reads the private keys of a Prism development keyring in its JSON form
// (what `python -m app.security.keys generate` writes; docs/encryption.md, "FileKeyring"),
// so a Go consumer decrypts with the same file as a Python one. Rotation windows are not
// applied here: every key in the file decrypts. Public-only entries are skipped. Every
// problem is reported at once as a bad_keyring error.
func LoadFileKeyring(data []byte) (*Keyring, error) {
	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, prismerr.New("bad_keyring", "keyring is not JSON: "+err.Error(), "pass the JSON form of a Prism keyring")
	}
	kr := NewKeyring()
	var problems []string
	b64 := func(raw map[string]any, name string) []byte {
		s, _ := raw[name].(string)
		b, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(s))
		if err != nil || s == "" {
			problems = append(problems, quote(raw["id"].(string))+": field "+name+" is not valid base64")
			return nil
		}
		return b
	}
	for i, raw := range doc.Keys {
		id, _ := raw["id"].(string)
		if id == "" {
			problems = append(problems, "keys["+itoa(i)+"]: missing id")
			continue
		}
		typ, _ := raw["type"].(string)
		switch typ {
		case "symmetric-256":
			if b := b64(raw, "secret"); b != nil {
				if len(b) != KeyBytes {
					problems = append(problems, quote(id)+": secret is "+itoa(len(b))+" bytes, needs 32")
				} else {
					kr.Symmetric[id] = b
				}
			}
		case "ml-kem-1024", "ml-kem-768":
			if _, ok := raw["private_seed"]; !ok {
				continue
			}
			seed := b64(raw, "private_seed")
			if seed == nil {
				continue
			}
			var err error
			if typ == "ml-kem-1024" {
				var k *mlkem.DecapsulationKey1024
				if k, err = mlkem.NewDecapsulationKey1024(seed); err == nil {
					kr.MLKEM1024[id] = k
				}
			} else {
				var k *mlkem.DecapsulationKey768
				if k, err = mlkem.NewDecapsulationKey768(seed); err == nil {
					kr.MLKEM768[id] = k
				}
			}
			if err != nil {
				problems = append(problems, quote(id)+": "+err.Error())
			}
		case "x25519-ml-kem-1024":
			if _, ok := raw["x25519_private"]; !ok {
				continue
			}
			x, seed := b64(raw, "x25519_private"), b64(raw, "ml_kem_private_seed")
			if x == nil || seed == nil {
				continue
			}
			xk, err1 := ecdh.X25519().NewPrivateKey(x)
			mk, err2 := mlkem.NewDecapsulationKey1024(seed)
			if err1 != nil || err2 != nil {
				problems = append(problems, quote(id)+": hybrid key material does not load")
				continue
			}
			kr.Hybrid[id] = &HybridPrivateKey{X25519: xk, MLKEM: mk}
		case "rsa-3072", "rsa-4096":
			s, ok := raw["private_pem"].(string)
			if !ok {
				continue
			}
			block, _ := pem.Decode([]byte(s))
			if block == nil {
				problems = append(problems, quote(id)+": private_pem is not PEM")
				continue
			}
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
			}
			rk, ok := k.(*rsa.PrivateKey)
			if err != nil || !ok {
				problems = append(problems, quote(id)+": private_pem is not an RSA private key")
				continue
			}
			kr.RSA[id] = rk
		default:
			problems = append(problems, quote(id)+": unknown key type "+quote(typ))
		}
	}
	if len(problems) > 0 {
		return nil, prismerr.New("bad_keyring", "keyring does not load: "+strings.Join(problems, "; "), "fix the listed keys")
	}
	return kr, nil
}
