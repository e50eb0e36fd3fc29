module example.com/prism-offline

go 1.24.0

require github.com/prism-envelope/prism/clients/go v0.0.0

require (
	github.com/klauspost/compress v1.18.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// Until the client's module path is published, build against this checkout.
replace github.com/prism-envelope/prism/clients/go => ../..
