# The Kubeflow Trainer documentation's first SDK example (Getting Started, "PyTorch Distributed
# Environment"), as written: the kubeflow SDK's default runtime torch-distributed, 3 nodes with 2 CPUs
# each, gloo. test_sdk.py runs this file unchanged (TrainerClient() reads KUBECONFIG and its
# context's namespace, as for any user); do not edit it to suit gangctl.
from kubeflow.trainer import CustomTrainer, TrainerClient


def get_torch_dist():
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    print("PyTorch Distributed Environment")
    print(f"WORLD_SIZE: {dist.get_world_size()}")
    print(f"RANK: {dist.get_rank()}")
    print(f"LOCAL_RANK: {os.environ['LOCAL_RANK']}")


# Create the TrainJob
job_id = TrainerClient().train(
    runtime=TrainerClient().get_runtime("torch-distributed"),
    trainer=CustomTrainer(
        func=get_torch_dist,
        num_nodes=3,
        resources_per_node={
            "cpu": 2,
        },
    ),
)

# Wait for TrainJob to complete
TrainerClient().wait_for_job_status(job_id)

# Print TrainJob logs
print("\n".join(TrainerClient().get_job_logs(name=job_id)))
