"""The verification-pod runner: a stand-in kubelet for pods labelled
clef.riotpiao.com/component=verification that are bound to kwok nodes.

kwok fakes every other pod; these it leaves alone (manifests/kwok-stages.yaml).  For each one the
runner looks the container image up in the image table (images.py) and then

* unpullable (or unknown) image: reports ErrImagePull, then ImagePullBackOff, and never runs it;
* hang: reports the container running and waits until the pod is deleted;
* good / fault: reports it running, executes the container's command on this host (argv, no
  shell) in the project's environment, and writes the real exit code and termination message
  back, so the Job controller decides the Job's outcome for real reasons.

Deletion is the runner's job too, as it is a kubelet's: the process group gets SIGTERM, then
SIGKILL after the grace period, the final status is written, and the pod is removed with a
zero-grace delete.  Output of every run is kept in <state>/logs/verify/.

Run as `python -m clef_devcluster.runner --state-dir DIR --kubeconfig FILE`; `up` starts it.

    watch.py      the watch loop (Runner): which pods, handed to whom, and their final delete
    worker.py     one pod from bound to terminal (PodWorker)
    container.py  one container's status, termination message, and process group
    env.py        the environment a container runs with
"""
