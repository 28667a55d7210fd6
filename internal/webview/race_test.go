//go:build race

package webview_test

// raceDetector is set when the tests run under the race detector, which slows the assigner
// several times over: the browser test then allows the page longer (make test runs it again
// without the detector, at the 2 s).
const raceDetector = true
