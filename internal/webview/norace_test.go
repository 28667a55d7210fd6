//go:build !race

package webview_test

const raceDetector = false
