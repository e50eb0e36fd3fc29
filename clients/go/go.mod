module github.com/prism-envelope/prism/clients/go

go 1.24.0

require google.golang.org/protobuf v1.36.12

require (
	github.com/bufbuild/protocompile v0.14.1
	github.com/klauspost/compress v1.18.2
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.2
	github.com/twmb/franz-go v1.19.5
	github.com/twmb/franz-go/pkg/kadm v1.16.0
	github.com/twmb/franz-go/pkg/kmsg v1.11.2
	golang.org/x/text v0.25.0
)

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0 // indirect
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/kms v1.62.6 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/go-viper/mapstructure/v2 v2.4.0 // indirect
	github.com/hamba/avro/v2 v2.31.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/pierrec/lz4/v4 v4.1.22 // indirect
	golang.org/x/sync v0.19.0 // indirect
)

require (
	golang.org/x/crypto v0.38.0
	golang.org/x/sys v0.33.0 // indirect
)
