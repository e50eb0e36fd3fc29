package awskms_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/encryption/awskms"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// fakeKMS answers KMS's JSON protocol (X-Amz-Target TrentService.*) on loopback, so the real
// AWS SDK client goes through its whole request path. A "wrapped" key is the data key's id;
// Decrypt checks the encryption context it was generated with, as KMS does.
type fakeKMS struct {
	mu       sync.Mutex
	keys     map[string][]byte
	contexts map[string]map[string]string
	next     int
}

func (f *fakeKMS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var in struct {
		KeyId             string
		EncryptionContext map[string]string
		CiphertextBlob    []byte
	}
	_ = json.Unmarshal(body, &in)
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	refuse := func(code string) {
		w.WriteHeader(400)
		_, _ = w.Write([]byte(`{"__type":"` + code + `","message":"refused"}`))
	}
	switch target := r.Header.Get("X-Amz-Target"); target {
	case "TrentService.GenerateDataKey":
		if in.KeyId == "alias/missing" {
			refuse("NotFoundException")
			return
		}
		if in.KeyId == "alias/disabled" {
			refuse("DisabledException")
			return
		}
		f.next++
		id := strings.Repeat("w", 8) + string(rune('a'+f.next))
		key := make([]byte, 32)
		key[0] = byte(f.next)
		f.keys[id], f.contexts[id] = key, in.EncryptionContext
		_ = json.NewEncoder(w).Encode(map[string]any{"KeyId": "arn:aws:kms:us-east-1:111122223333:key/" + in.KeyId,
			"Plaintext": base64.StdEncoding.EncodeToString(key), "CiphertextBlob": base64.StdEncoding.EncodeToString([]byte(id))})
	case "TrentService.Decrypt":
		id := string(in.CiphertextBlob)
		want, ok := f.contexts[id]
		same := ok && len(want) == len(in.EncryptionContext)
		for k, v := range want {
			same = same && in.EncryptionContext[k] == v
		}
		if !same {
			refuse("InvalidCiphertextException")
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"KeyId": in.KeyId, "Plaintext": base64.StdEncoding.EncodeToString(f.keys[id])})
	default:
		refuse("UnsupportedOperationException")
	}
}

func provider(t *testing.T, extra map[string]string) *awskms.Provider {
	srv := httptest.NewServer(&fakeKMS{keys: map[string][]byte{}, contexts: map[string]map[string]string{}})
	t.Cleanup(srv.Close)
	client := kms.New(kms.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "testing", SecretAccessKey: "testing"}, nil
		})})
	return &awskms.Provider{Client: client, EncryptionContext: extra}
}

func TestAWSKMSThroughTheSDK(t *testing.T) {
	ctx := context.Background()
	p := provider(t, map[string]string{"environment": "test"})
	kr := encryption.NewKeyring()
	kr.DataKeys[p.WrapName()] = p
	env, _ := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": 7}, envelope.Options{})
	if err := encryption.EncryptWithDataKey(ctx, env, encryption.AES256GCM, "alias/orders", p, encryption.Options{}); err != nil {
		t.Fatal(err)
	}
	meta := env.Header.GetSecurity().GetEncryption()
	if meta.GetKeyId() != "arn:aws:kms:us-east-1:111122223333:key/alias/orders" || meta.GetAlgorithmParams() != `{"key_wrap":"aws-kms"}` {
		t.Fatalf("metadata %v", meta)
	}
	plain, err := encryption.Decrypt(env, kr, encryption.DecryptOptions{Context: ctx})
	if err != nil || string(plain) != `{"order_id":7}` {
		t.Fatalf("%q %v", plain, err)
	}
	// another environment's context: KMS refuses the wrapped key
	prod := provider(t, map[string]string{"environment": "production"})
	prod.Client = p.Client
	kr2 := encryption.NewKeyring()
	kr2.DataKeys[prod.WrapName()] = prod
	if _, err := encryption.Decrypt(env, kr2, encryption.DecryptOptions{}); !errors.Is(err, prismerr.ErrDecryption) {
		t.Fatalf("other context: %v", err)
	}
	for keyID, want := range map[string]error{"alias/missing": prismerr.ErrUnknownKey, "alias/disabled": prismerr.ErrKeyNotUsable} {
		e, _ := envelope.NewJSON("orders.created", "order-events", 1, envelope.Options{})
		if err := encryption.EncryptWithDataKey(ctx, e, encryption.AES256GCM, keyID, p, encryption.Options{}); !errors.Is(err, want) {
			t.Errorf("%s: %v", keyID, err)
		}
	}
	down := provider(t, nil)
	down.Client = kms.New(kms.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:1"), RetryMaxAttempts: 1,
		Credentials: aws.AnonymousCredentials{}})
	e, _ := envelope.NewJSON("orders.created", "order-events", 1, envelope.Options{})
	if err := encryption.EncryptWithDataKey(ctx, e, encryption.AES256GCM, "alias/orders", down, encryption.Options{}); !errors.Is(err, prismerr.ErrKeyProvider) {
		t.Errorf("unreachable: %v", err)
	}
}
