def run(cfg):
    from omegaconf import OmegaConf
    print(OmegaConf.to_yaml(cfg))
