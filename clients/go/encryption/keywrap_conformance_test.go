package encryption_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"maps"
	"testing"

	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

type keyWrapFile struct {
	WrapName        string            `json:"wrap_name"`
	ProviderContext map[string]string `json:"provider_context"`
	DataKeys        []struct {
		KeyID             string            `json:"key_id"`
		WrappedHex        string            `json:"wrapped_hex"`
		PlaintextHex      string            `json:"plaintext_hex"`
		EncryptionContext map[string]string `json:"encryption_context"`
	} `json:"data_keys"`
	Vectors []struct {
		Name              string            `json:"name"`
		EnvelopeHex       string            `json:"envelope_hex"`
		Expected          string            `json:"expected"`
		PlaintextHex      string            `json:"plaintext_hex"`
		AADHex            string            `json:"aad_hex"`
		EncryptionContext map[string]string `json:"encryption_context"`
	} `json:"vectors"`
}

// tableService is the key service of a key_wrap vector file: it unwraps a wrapped key only
// under exactly the context the table records for it (KMS's rule), and remembers what it was
// sent. The provider context is merged as a real provider merges it (awskms.Provider): the
// envelope's keys win.
type tableService struct {
	f    *keyWrapFile
	sent map[string]string
}

func (s *tableService) WrapName() string { return s.f.WrapName }

func (s *tableService) GenerateDataKey(context.Context, string, map[string]string) (encryption.DataKey, error) {
	return encryption.DataKey{}, prismerr.New("key_provider_failed", "the vectors do not generate keys", "")
}

func (s *tableService) DecryptDataKey(_ context.Context, keyID string, wrapped []byte, c map[string]string) ([]byte, error) {
	full := maps.Clone(s.f.ProviderContext)
	maps.Copy(full, c)
	s.sent = full
	for _, k := range s.f.DataKeys {
		if k.KeyID == keyID && k.WrappedHex == hex.EncodeToString(wrapped) && maps.Equal(k.EncryptionContext, full) {
			return hex.DecodeString(k.PlaintextHex)
		}
	}
	return nil, prismerr.New("decryption_failed", "the key service refused the wrapped data key", "").At("security.encryption.encapsulated_key")
}

// TestKeyWrapVectors decrypts every vector of conformance/key-wrap/ through the key_wrap path
// (Keyring.DataKeys) and checks the outcome, the AAD and the context sent to the key service.
func TestKeyWrapVectors(t *testing.T) {
	var ran conformance.Counter
	defer ran.Check(t, "key_wrap")
	paths, err := conformance.FilesOfKind("key_wrap")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		var f keyWrapFile
		if err := conformance.File(path, &f); err != nil {
			t.Fatal(err)
		}
		svc := &tableService{f: &f}
		kr := encryption.NewKeyring()
		kr.DataKeys[f.WrapName] = svc
		for _, v := range f.Vectors {
			t.Run(v.Name, func(t *testing.T) {
				ran.Ran()
				svc.sent = nil
				env, err := envelope.Decode(mustHex(t, v.EnvelopeHex))
				if err != nil {
					t.Fatal(err)
				}
				meta, md := env.Header.GetSecurity().GetEncryption(), env.Header.GetMetadata()
				if aad := encryption.BuildAAD(md.GetMessageId(), md.GetNamespace(), md.GetTopic(), meta.GetAlgorithm(), meta.GetKeyId()); !bytes.Equal(aad, mustHex(t, v.AADHex)) {
					t.Errorf("recomputed AAD %x, want %s", aad, v.AADHex)
				}
				plain, err := encryption.Decrypt(env, kr, encryption.DecryptOptions{})
				if got := conformance.Verdict(err, "plaintext"); got != v.Expected {
					t.Fatalf("got %s (%v), want %s", got, err, v.Expected)
				}
				if err == nil {
					if !bytes.Equal(plain, mustHex(t, v.PlaintextHex)) {
						t.Errorf("plaintext %x, want %s", plain, v.PlaintextHex)
					}
					if !maps.Equal(svc.sent, v.EncryptionContext) {
						t.Errorf("context sent %v, want %v", svc.sent, v.EncryptionContext)
					}
				}
			})
		}
	}
}
