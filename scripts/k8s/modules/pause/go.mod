module cordon.local/k8s/pause

// Cordon's own pod sandbox program, v1 (scripts/setup.d/80-k8s.sh builds it as that version).

go 1.26
