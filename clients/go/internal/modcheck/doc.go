// Package modcheck holds the test that the client can be consumed from another module before
// its module path is published: examples/offline (a module with a replace directive) builds
// and runs, and so does a module that reaches the client through a go.work workspace.
package modcheck
