module github.com/prism-envelope/prism/clients/go

go 1.24

require google.golang.org/protobuf v1.36.12
