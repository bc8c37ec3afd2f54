package main

import (
	"bytes"
	"io"
	"net/http"
)

// postGW sends a Messages body to the gateway at base; a connection cut
// (the gateway killed) is an error, not a failure of the test.
func postGW(base, token string, body []byte) (int, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
