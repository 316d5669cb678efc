"""mindcv's ``train.py`` (mindspore-lab/mindcv v0.3.0), cut down to what a tiny job on CPU ranks
needs and run as it runs: ``create_dataset`` (an ImageFolder), ``create_transforms``,
``create_loader``, ``create_model``, ``create_loss``, ``create_scheduler``, ``create_optimizer``,
``create_trainer`` (a ``mindspore.Model``) and mindcv's ``StateMonitor``, which saves
``<ckpt_save_dir>/<model>-<epoch>_<batch>.ckpt`` and ``optim_<model>.ckpt`` at each epoch's end
on rank 0 alone. Given ``--ckpt_path FILE`` it resumes as ``train.py`` does: the model from FILE,
the optimizer from ``optim_<model>.ckpt`` with ``--resume_opt``, the epoch parsed from FILE's
name. Nothing of npu-launch is imported: under npu-launch the path comes from
``--ckpt_path '{checkpoint:-}'``.

Two changes from ``train.py``, both for what fails on CPU ranks under any launcher:

* it all-reduces the sample count as an int32 tensor, and MindSpore's CPU ``AllReduce`` has no
  int32 kernel (``Select CPU operator[AllReduce] fail! Unsupported data type!``): here float32;
* resumed, it trains ``--epoch_size`` epochs more (``Model.train(args.epoch_size, ...)``, no
  ``initial_epoch``), past the end of its learning-rate schedule, where the step's ``Gather``
  of the rate fails on CPU: here the epochs left, ``--epoch_size`` minus the epoch resumed from.

Added for the tests: each rank prints ``mindcv_train: rank R step G loss L`` after every step
(G counted over the whole run, as ``StateMonitor`` counts it: ``last_epoch`` epochs before this
launch's steps); ``--fail_at_step G --fail_rank R``: rank R raises as step G begins, in the
first attempt only (``NPU_LAUNCH_RESTART`` unset or 0: the one variable of npu-launch's read). ``python mindcv_train.py --make_data DIR`` writes the generated images instead
(``DIR/train/class_<k>/<i>.png``; ``write_images`` imports no MindSpore).
"""
import argparse
import os
from typing import Any


def write_images(root: str, classes: int = 2, per_class: int = 8, size: int = 32, seed: int = 0) -> None:
    """An ImageFolder of ``classes`` x ``per_class`` PNG images of ``size`` pixels: each class a
    colour of its own, with noise, so that a small network can learn them."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for k in range(classes):
        folder = os.path.join(root, "train", f"class_{k}")
        os.makedirs(folder, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for i in range(per_class):
            noise = rng.integers(-40, 41, (size, size, 3))
            pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, f"{i:03d}.png"))


def str2bool(text: str) -> bool:
    return text.lower() in ("true", "1", "yes")


def parse_args() -> argparse.Namespace:
    """``train.py``'s options of the same names and defaults, where a tiny CPU job keeps them;
    smaller defaults where it cannot (model, image size, batch, epochs, workers)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--make_data", default="", help="write the generated images here and exit")
    parser.add_argument("--mode", type=int, default=0, help="0: GRAPH_MODE (train.py's default), 1: PYNATIVE")
    parser.add_argument("--distribute", type=str2bool, default=False)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data_dir", default="./data")
    parser.add_argument("--num_parallel_workers", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--image_resize", type=int, default=32)
    parser.add_argument("--model", default="mobilenet_v1_025")
    parser.add_argument("--num_classes", type=int, default=2)
    parser.add_argument("--ckpt_path", default="")
    parser.add_argument("--resume_opt", type=str2bool, default=False)
    parser.add_argument("--ckpt_save_dir", default="./ckpt")
    parser.add_argument("--keep_checkpoint_max", type=int, default=10)
    parser.add_argument("--epoch_size", type=int, default=3)
    parser.add_argument("--dataset_sink_mode", type=str2bool, default=True)
    parser.add_argument("--opt", default="momentum")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--warmup_epochs", type=int, default=0)
    parser.add_argument("--log_interval", type=int, default=100)
    parser.add_argument("--fail_at_step", type=int, default=0)
    parser.add_argument("--fail_rank", type=int, default=1)
    return parser.parse_args()


def step_printer(rank: int, last_epoch: int, fail_at: int, fail_rank: int) -> Any:
    """A callback that prints each step's loss, and raises at ``fail_at`` on ``fail_rank``."""
    import numpy as np
    from mindspore.train import Callback

    class StepLosses(Callback):
        def _step(self, params: Any) -> int:
            return int(params.cur_step_num) + last_epoch * int(params.batch_num)

        def on_train_step_begin(self, run_context: Any) -> None:
            if fail_at and rank == fail_rank and self._step(run_context.original_args()) == fail_at:
                raise RuntimeError(f"mindcv_train: rank {rank} fails at step {fail_at}, as asked")

        def on_train_step_end(self, run_context: Any) -> None:
            params = run_context.original_args()
            outputs = params.net_outputs
            loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
            print(f"mindcv_train: rank {rank} step {self._step(params)} loss {float(np.mean(loss.asnumpy())):.6f}",
                  flush=True)

    return StepLosses()


def main() -> None:
    args = parse_args()
    if args.make_data:
        write_images(args.make_data)
        return
    import logging

    import mindspore as ms
    from mindcv.data import create_dataset, create_loader, create_transforms
    from mindcv.loss import create_loss
    from mindcv.models import create_model
    from mindcv.optim import create_optimizer
    from mindcv.scheduler import create_scheduler
    from mindcv.utils import AllReduceSum, StateMonitor, create_trainer, get_metrics, set_logger, set_seed
    from mindspore import Tensor
    from mindspore.communication import get_group_size, get_rank, init

    logger = logging.getLogger("mindcv.train")
    ms.set_context(mode=args.mode)
    if args.distribute:
        init()
        rank_id, device_num = get_rank(), get_group_size()
        ms.set_auto_parallel_context(device_num=device_num, parallel_mode="data_parallel", gradients_mean=True)
        all_reduce = AllReduceSum()
    else:
        rank_id, device_num = None, None
    set_seed(args.seed)
    set_logger(name="mindcv", output_dir=args.ckpt_save_dir, rank=rank_id, color=False)

    dataset_train = create_dataset(name="", root=args.data_dir, split="train", shuffle=True,
                                   num_shards=device_num, shard_id=rank_id,
                                   num_parallel_workers=args.num_parallel_workers)
    num_classes = args.num_classes
    transform_list = create_transforms(dataset_name="", is_training=True, image_resize=args.image_resize)
    loader_train = create_loader(dataset=dataset_train, batch_size=args.batch_size, drop_remainder=True,
                                 is_training=True, num_classes=num_classes, transform=transform_list,
                                 num_parallel_workers=args.num_parallel_workers)
    num_batches = loader_train.get_dataset_size()
    train_count = dataset_train.get_dataset_size()
    if args.distribute:
        # train.py: Tensor(train_count, ms.int32). The CPU AllReduce has no int32 kernel.
        train_count = int(all_reduce(Tensor(train_count, ms.float32)).asnumpy())

    network = create_model(model_name=args.model, num_classes=num_classes, in_channels=3,
                           pretrained=False, checkpoint_path=args.ckpt_path)
    loss = create_loss(name="CE", reduction="mean", label_smoothing=0.0, aux_factor=0.0)
    lr_scheduler = create_scheduler(num_batches, scheduler="cosine_decay", lr=args.lr, min_lr=1e-6,
                                    warmup_epochs=args.warmup_epochs, num_epochs=args.epoch_size)
    if args.ckpt_path != "" and args.resume_opt:
        opt_ckpt_path = os.path.join(args.ckpt_save_dir, f"optim_{args.model}.ckpt")
    else:
        opt_ckpt_path = ""
    optimizer = create_optimizer(network, opt=args.opt, lr=lr_scheduler, weight_decay=1e-6, momentum=0.9,
                                 checkpoint_path=opt_ckpt_path)
    metrics = get_metrics(num_classes)
    trainer = create_trainer(network, loss, optimizer, metrics, amp_level="O0", amp_cast_list=None,
                             loss_scale_type="fixed", loss_scale=1.0, drop_overflow_update=False)

    begin_step = 0
    begin_epoch = 0
    if args.ckpt_path != "":
        begin_step = optimizer.global_step.asnumpy()[0]
        begin_epoch = int(args.ckpt_path.split("/")[-1].split("-")[1].split("_")[0])
    state_cb = StateMonitor(trainer, model_name=args.model, last_epoch=begin_epoch,
                            dataset_sink_mode=args.dataset_sink_mode, dataset_val=None,
                            metric_name=list(metrics.keys()), ckpt_save_dir=args.ckpt_save_dir,
                            ckpt_save_interval=1, ckpt_save_policy="latest_k",
                            ckpt_keep_max=args.keep_checkpoint_max,
                            summary_dir=f"./{args.ckpt_save_dir}/summary", log_interval=args.log_interval,
                            rank_id=rank_id, device_num=device_num)
    first_attempt = os.environ.get("NPU_LAUNCH_RESTART", "0") == "0"  # npu-launch's restart count, if any
    printer = step_printer(rank_id or 0, begin_epoch, args.fail_at_step if first_attempt else 0, args.fail_rank)
    logger.info(f"Number of training samples: {train_count}, batches: {num_batches}, model: {args.model}")
    if args.ckpt_path != "":
        logger.info(f"Resume training from {args.ckpt_path}, last step: {begin_step}, last epoch: {begin_epoch}")
    else:
        logger.info("Start training")
    # train.py: trainer.train(args.epoch_size, ...) whether resuming or not. A resumed run then
    # trains --epoch_size epochs more, and its learning-rate schedule (--epoch_size epochs long)
    # runs out first: on CPU the step after it fails ("For 'Gather', the 'input_indices' should
    # be in the range [0, N), but got N"). Here, the epochs left, as the model zoo's ResNet does.
    trainer.train(args.epoch_size - begin_epoch, loader_train, callbacks=[state_cb, printer],
                  dataset_sink_mode=args.dataset_sink_mode)


if __name__ == "__main__":
    main()
