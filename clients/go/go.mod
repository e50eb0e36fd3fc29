module github.com/prism-envelope/prism/clients/go

go 1.25

require google.golang.org/protobuf v1.36.12

require github.com/klauspost/compress v1.20.4
