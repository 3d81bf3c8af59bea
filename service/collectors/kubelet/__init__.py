"""The kubelet's pod-resources API: which pod and container each GPU is allocated to."""
