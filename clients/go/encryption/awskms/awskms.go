// Package awskms is the AWS KMS key service of the key_wrap pattern
// (encryption.DataKeyProvider), the Go side of the Python worker's AwsKmsProvider: per
// message, KMS GenerateDataKey (AES_256) gives a fresh data key and its wrapped copy; KMS
// Decrypt unwraps it under the same encryption context (the envelope's message id, namespace
// and topic, plus Provider.EncryptionContext), which KMS authenticates and CloudTrail logs.
//
//	cfg, _ := config.LoadDefaultConfig(ctx)                   // github.com/aws/aws-sdk-go-v2/config
//	p := &awskms.Provider{Client: kms.NewFromConfig(cfg)}
//	kr.DataKeys[p.WrapName()] = p                              // decrypt
//	err := encryption.EncryptWithDataKey(ctx, env, encryption.AES256GCM, "alias/orders", p, encryption.Options{})
package awskms

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
	"github.com/aws/smithy-go"
	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// API is the part of *kms.Client the provider calls.
type API interface {
	GenerateDataKey(ctx context.Context, in *kms.GenerateDataKeyInput, optFns ...func(*kms.Options)) (*kms.GenerateDataKeyOutput, error)
	Decrypt(ctx context.Context, in *kms.DecryptInput, optFns ...func(*kms.Options)) (*kms.DecryptOutput, error)
}

// Provider wraps data keys with AWS KMS.
type Provider struct {
	Client API
	// EncryptionContext is added to the envelope's (e.g. {"environment": "production"});
	// the envelope's own keys win, as in Python.
	EncryptionContext map[string]string
}

// WrapName is "aws-kms", what the Python worker records in algorithm_params.key_wrap.
func (p *Provider) WrapName() string { return "aws-kms" }

func (p *Provider) context(c map[string]string) map[string]string {
	out := make(map[string]string, len(c)+len(p.EncryptionContext))
	for k, v := range p.EncryptionContext {
		out[k] = v
	}
	for k, v := range c {
		out[k] = v
	}
	return out
}

// GenerateDataKey asks KMS for a fresh AES_256 data key under keyID (an ARN, key id or alias).
func (p *Provider) GenerateDataKey(ctx context.Context, keyID string, c map[string]string) (encryption.DataKey, error) {
	out, err := p.Client.GenerateDataKey(ctx, &kms.GenerateDataKeyInput{KeyId: &keyID, KeySpec: types.DataKeySpecAes256, EncryptionContext: p.context(c)})
	if err != nil {
		return encryption.DataKey{}, kmsError(err, "GenerateDataKey", keyID)
	}
	id := keyID
	if out.KeyId != nil {
		id = *out.KeyId
	}
	return encryption.DataKey{KeyID: id, Plaintext: out.Plaintext, Wrapped: out.CiphertextBlob}, nil
}

// DecryptDataKey asks KMS to unwrap a data key under the same encryption context.
func (p *Provider) DecryptDataKey(ctx context.Context, keyID string, wrapped []byte, c map[string]string) ([]byte, error) {
	out, err := p.Client.Decrypt(ctx, &kms.DecryptInput{CiphertextBlob: wrapped, KeyId: &keyID, EncryptionContext: p.context(c)})
	if err != nil {
		return nil, kmsError(err, "Decrypt", keyID)
	}
	return out.Plaintext, nil
}

// kmsError maps KMS's error codes onto Prism's codes as the Python provider does (_kms_error);
// the AWS message may name ARNs, never key material.
func kmsError(err error, op, keyID string) error {
	where := "security.encryption.key_id"
	var api smithy.APIError
	if !errors.As(err, &api) {
		return prismerr.New("key_provider_failed", "KMS "+op+" failed for "+keyID+": "+err.Error(),
			"check KMS availability and the network; retry later").At(where)
	}
	switch code := api.ErrorCode(); code {
	case "InvalidCiphertextException", "IncorrectKeyException":
		return prismerr.New("decryption_failed", "KMS "+op+" refused the wrapped data key for "+keyID+" ("+code+")",
			"the wrapped key, key id or encryption context (namespace/topic/message id) changed after encryption").At("security.encryption.encapsulated_key")
	case "NotFoundException":
		return prismerr.New("unknown_key", "KMS key "+keyID+" does not exist ("+op+")", "check the key ARN/alias and the region").At(where)
	case "DisabledException", "KMSInvalidStateException", "KeyUnavailableException":
		return prismerr.New("key_not_usable", "KMS key "+keyID+" cannot be used now ("+code+")", "enable the key or cancel its pending deletion").At(where)
	default:
		return prismerr.New("key_provider_failed", "KMS "+op+" failed for "+keyID+": "+code,
			"check IAM permissions (kms:GenerateDataKey/kms:Decrypt) and KMS availability").At(where)
	}
}
