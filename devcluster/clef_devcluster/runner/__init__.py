"""The runner: a stand-in kubelet for the pods of kwok nodes that really run on this host:
pods labelled clef.riotpiao.com/component=verification, and pods with a container image under
registry.clef.test/engines/ (engine images).  kwok fakes every other pod; these it leaves alone
(manifests/kwok-stages.yaml).  For each one the runner looks the container image up in the image
table (images.py) and then

* unpullable (or unknown) image: reports ErrImagePull, then ImagePullBackOff, and never runs it;
* hang: reports the container running and waits until the pod is deleted;
* good / fault: reports it running, executes the container's command on this host (argv, no
  shell) in the project's environment, and writes the real exit code and termination message
  back, so the Job controller decides the Job's outcome for real reasons;
* serve: the engine's command is served by `clef-runtime serve` in the image's dialect.

Each pod gets its own loopback address as its pod IP, its probes are run, its volumes set up as
host directories, its output kept and served to `kubectl logs` through the API server.  Deletion
is the runner's job too, as it is a kubelet's: the process group gets SIGTERM, then SIGKILL after
the grace period, the final status is written, and the pod is removed with a zero-grace delete.

Run as `python -m clef_devcluster.runner --state-dir DIR --kubeconfig FILE`; `up` starts it.

    watch.py      the watch loop (Runner): which pods, handed to whom, their final delete, the
                  nodes' kubelet endpoint
    worker.py     one pod from bound to terminal (PodWorker)
    container.py  one container's status, termination message, and process group
    env.py        the environment a container runs with
    engine.py     a serve image's engine argv as `clef-runtime serve`
    network.py    pod addresses (127.<b>.x.y)
    probes.py     startup, readiness and liveness probes
    volumes.py    hostPath, configMap, secret and emptyDir volumes without a mount namespace
    logs.py       output capture and the kubelet's log endpoint
    memo.py       a test session's memo of finished `clef-runtime verify` runs, replayed
"""
