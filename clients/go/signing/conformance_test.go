package signing_test

import (
	"bytes"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/signing"
)

func verdict(err error) string { return conformance.Verdict(err, "valid") }

func keysOf(t *testing.T, k conformance.Key) *signing.Keys {
	t.Helper()
	switch k.Algorithm {
	case signing.HMACSHA256:
		secret, _ := hex.DecodeString(k.SecretHex)
		sk, err := signing.NewHMACKey(k.KeyID, secret)
		if err != nil {
			t.Fatal(err)
		}
		return signing.NewKeys(sk.VerificationKey())
	case signing.Ed25519:
		pub, _ := hex.DecodeString(k.PublicKeyHex)
		vk, err := signing.NewEd25519VerificationKey(k.KeyID, pub)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := hex.DecodeString(k.PrivateSeedHex)
		sk, err := signing.NewEd25519Key(k.KeyID, seed)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sk.VerificationKey().PublicKey, vk.PublicKey) {
			t.Fatal("the vector file's seed and public key disagree")
		}
		return signing.NewKeys(vk)
	}
	t.Fatalf("unknown algorithm %q", k.Algorithm)
	return nil
}

// TestSignatureVectors runs every vector of conformance/signatures/ with both policies and
// checks the signed message M byte for byte where the vector gives it.
func TestSignatureVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "signature")
	files, err := conformance.SignatureFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 6 {
		t.Fatalf("expected the 6 signature vector files, found %d", len(files))
	}
	yes := true
	for _, f := range files {
		keys := keysOf(t, f.Key)
		for _, v := range f.Vectors {
			t.Run(filepath.Base(f.Path)+"/"+v.Name, func(t *testing.T) {
				ran.Ran()
				signing.ClearVerificationCache()
				data := v.Envelope()
				_, err := signing.Verify(data, keys, signing.VerifyOptions{})
				if got := verdict(err); got != v.Expected {
					t.Errorf("default policy: got %s (%v), want %s", got, err, v.Expected)
				}
				_, err = signing.Verify(data, keys, signing.VerifyOptions{AcceptLegacyScope: &yes})
				if got := verdict(err); got != v.ExpectedAcceptLegacyScope {
					t.Errorf("legacy accepted: got %s (%v), want %s", got, err, v.ExpectedAcceptLegacyScope)
				}
				if v.SignedMessageHex != "" {
					want := v.SignedMessage()
					m, _, err := signing.SignedMessage(data, envelope.Auto)
					if err != nil {
						t.Fatalf("signed message: %v", err)
					}
					if !bytes.Equal(m, want) {
						t.Errorf("signed message M:\n got %x\nwant %x", m, want)
					}
				}
			})
		}
	}
}
