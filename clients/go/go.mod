module github.com/prism-envelope/prism/clients/go

go 1.24.0

require google.golang.org/protobuf v1.36.12

require github.com/klauspost/compress v1.18.0

require (
	golang.org/x/crypto v0.36.0
	golang.org/x/sys v0.31.0 // indirect
)
